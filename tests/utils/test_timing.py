"""timer / marked_timer: seconds accumulate per stage name, against a scripted clock."""

from __future__ import annotations

import pytest

from hybridrl.utils import timing
from hybridrl.utils.timing import marked_timer, timer


@pytest.fixture
def clock(monkeypatch):
    """perf_counter returns the next scripted reading on each call."""
    readings = iter([10.0, 10.5, 20.0, 21.25, 30.0, 33.0, 40.0, 40.125])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(readings))


def test_a_stage_timed_twice_accumulates(clock):
    timing_raw: dict[str, float] = {}
    with timer("gen", timing_raw):  # 10.0 -> 10.5
        pass
    with timer("gen", timing_raw):  # 20.0 -> 21.25
        pass
    with marked_timer("adv", timing_raw, color="red"):  # 30.0 -> 33.0; colour is accepted and unused
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
