"""Metric values and their reduction to one number per key."""

import math

import pytest
import torch

from hybridrl.utils.metric import AggregationType, Metric, append_to_dict, reduce_metrics


def test_a_summed_metric_adds_its_micro_batch_parts():
    # micro-batch losses already divided by the mini-batch's token count: 0.25 + 0.5 = 0.75 is the loss
    collected: dict = {}
    for part in (torch.tensor(0.25), torch.tensor(0.5)):
        append_to_dict(collected, {"critic/vf_loss": Metric(AggregationType.SUM, part), "plain": [1.0, 3.0]})
    assert reduce_metrics(collected) == {"critic/vf_loss": 0.75, "plain": 2.0}  # plain: mean of 1, 3, 1, 3


def test_reduce_by_key_name_and_metric_checks():
    assert reduce_metrics({"len/max": [1, 5], "len/min": [1, 5], "empty": []})["len/max"] == 5
    assert math.isnan(reduce_metrics({"empty": []})["empty"])
    assert Metric("max", [2, 9, 4]).aggregate() == 9
    with pytest.raises(ValueError, match="mean metric"):
        Metric("sum", 1).extend(Metric("mean", 2))
    with pytest.raises(ValueError):
        Metric("median")
    append_to_dict(target := {}, {"loss": 1.0}, prefix="actor/")
    assert target == {"actor/loss": [1.0]}
