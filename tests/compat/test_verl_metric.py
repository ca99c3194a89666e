"""verl's metric names in compat/verl_metric.py: Metric values with their own aggregation, append_to_dict,
reduce_metrics over both kinds, and marked_timer."""

import time

import pytest
import torch
from verl_metric import AggregationType, Metric, append_to_dict, marked_timer, reduce_metrics


def test_a_summed_metric_adds_its_micro_batch_parts():
    # micro-batch losses already divided by the mini-batch's token count: 0.25 + 0.5 = 0.75 is the loss
    collected: dict = {}
    for part in (torch.tensor(0.25), torch.tensor(0.5)):
        append_to_dict(collected, {"critic/vf_loss": Metric(AggregationType.SUM, part), "plain": [1.0, 3.0]})
    assert reduce_metrics(collected) == {"critic/vf_loss": 0.75, "plain": 2.0}  # plain: mean of 1, 3, 1, 3
    assert reduce_metrics({"len/max": [1, 5]}) == {"len/max": 5}  # other keys reduce as the core's do


def test_metric_checks():
    assert Metric("max", [2, 9, 4]).aggregate() == 9
    with pytest.raises(ValueError, match="mean metric"):
        Metric("sum", 1).extend(Metric("mean", 2))
    with pytest.raises(ValueError):
        Metric("median")
    append_to_dict(target := {}, {"loss": 1.0}, prefix="actor/")
    assert target == {"actor/loss": [1.0]}


def test_marked_timer_accumulates_and_ignores_its_colour(monkeypatch):
    readings = iter([30.0, 33.0, 40.0, 40.125])
    monkeypatch.setattr(time, "perf_counter", lambda: next(readings))
    timing_raw: dict[str, float] = {}
    for _ in range(2):
        with marked_timer("adv", timing_raw, color="red"):
            pass
    assert timing_raw == {"adv": 3.0 + 0.125}
