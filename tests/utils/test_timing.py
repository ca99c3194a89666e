"""timer: seconds accumulate per stage name, against a scripted clock."""

from __future__ import annotations

import pytest

from hybridrl.utils import metric
from hybridrl.utils.metric import timer


@pytest.fixture
def clock(monkeypatch):
    """perf_counter returns the next scripted reading on each call."""
    readings = iter([10.0, 10.5, 20.0, 21.25, 30.0, 33.0, 40.0, 40.125])
    monkeypatch.setattr(metric.time, "perf_counter", lambda: next(readings))


def test_a_stage_timed_twice_accumulates(clock):
    timing_raw: dict[str, float] = {}
    with timer("gen", timing_raw):  # 10.0 -> 10.5
        pass
    with timer("gen", timing_raw):  # 20.0 -> 21.25
        pass
    with timer("adv", timing_raw):  # 30.0 -> 33.0
        pass
    assert timing_raw == {"gen": 0.5 + 1.25, "adv": 3.0}


def test_time_is_recorded_when_the_stage_raises(clock):
    timing_raw = {"step": 1.0}
    with pytest.raises(RuntimeError, match="boom"), timer("step", timing_raw):  # 10.0 -> 10.5
        raise RuntimeError("boom")
    assert timing_raw == {"step": 1.5}


def test_real_clock_gives_a_non_negative_duration():
    timing_raw: dict[str, float] = {}
    with timer("noop", timing_raw):
        sum(range(1000))
    assert timing_raw["noop"] >= 0.0


def test_worker_seconds_travel_per_rank_and_reduce_to_the_slowest(clock):
    from hybridrl.protocol import DataProto
    from hybridrl.utils.metric import WORKER_SECONDS, pop_worker_seconds, report_worker_seconds

    @report_worker_seconds
    def update(metrics: dict) -> DataProto:
        return DataProto(meta_info={"metrics": metrics})

    rank0 = update({"actor/pg_loss": [0.5]})  # 10.0 -> 10.5: 0.5 s
    rank1 = update({"actor/pg_loss": [0.7]})  # 20.0 -> 21.25: 1.25 s
    merged = DataProto.concat([rank0, rank1])  # what the worker group's collect does
    assert merged.meta_info["metrics"] == {"actor/pg_loss": [0.5, 0.7], WORKER_SECONDS: [0.5, 1.25]}
    assert pop_worker_seconds(merged.meta_info) == 1.25  # the slowest rank
    assert merged.meta_info["metrics"] == {"actor/pg_loss": [0.5, 0.7]}  # the worker's own metrics stay

    only_time = DataProto.concat([update({})])  # 30.0 -> 33.0
    assert pop_worker_seconds(only_time.meta_info) == 3.0
    assert "metrics" not in only_time.meta_info  # nothing left to merge into a later union
    assert pop_worker_seconds(only_time.meta_info) is None
