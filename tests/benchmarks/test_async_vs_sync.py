"""async_vs_sync.py: each pool's idle share and the time to reach an accuracy, against hand-computed values."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import async_vs_sync  # noqa: E402  (a script beside the package, not part of it)


def _step(step: float, gen: float | None, update: float, sync: float = 0.0, waited: float = 0.0,
          rollout_waited: float = 0.0) -> dict:
    metrics = {"timing_s/step": step, "timing_s/update_actor_worker": update, "timing_s/old_log_prob_worker": 0.0,
               "timing_s/weight_sync": sync, "timing_s/trainer_idle": waited, "response_length/mean": 20.0,
               "timing_s/rollout_idle": rollout_waited}
    if gen is not None:  # streaming's generation runs beside the step, untimed by it
        metrics["timing_s/gen_worker"] = gen
    return metrics


def test_idle_shares_per_layout():
    first = _step(100.0, 50.0, 50.0)  # the warm-up step is left out
    # split, one step off: training 6 + sync 1 of a 10 s step, generation 3 + sync 1 (overlapped)
    shares = async_vs_sync.idle_shares([first, _step(10.0, 3.0, 6.0, 1.0, 0.5)], "one step off")
    assert shares["samples_per_s"] == pytest.approx(12.8)
    assert shares["tokens_per_s"] == pytest.approx(12.8 * 20)
    assert shares["training_idle"] == pytest.approx(0.3) and shares["rollout_idle"] == pytest.approx(0.6)
    assert shares["trainer_wait"] == pytest.approx(0.5)
    # colocated: the same processes generate then train, so both pools are idle only outside both phases
    colocated = async_vs_sync.idle_shares([first, _step(8.0, 3.0, 4.0)], "colocated sync")
    assert colocated["training_idle"] == colocated["rollout_idle"] == pytest.approx(1 / 8)
    # streaming: the rollout's thread waited 2.5 s of a 10 s step for budget or a sync
    streaming = async_vs_sync.idle_shares([first, _step(10.0, None, 6.0, 1.0, 0.5, 2.5)], "streaming")
    assert streaming["rollout_idle"] == pytest.approx(0.25) and streaming["training_idle"] == pytest.approx(0.3)


def test_accuracy_over_time_counts_from_the_first_steps_start(tmp_path):
    key = async_vs_sync.ACCURACY_KEY
    rows = [{key: 0.5, "training/global_step": 0, "training/time": 95.0},  # before training: at -5 s
            {"timing_s/step": 4.0, "training/time": 104.0},
            {"timing_s/step": 5.0, "training/time": 110.0, key: 0.8},
            {"timing_s/step": 5.0, "training/time": 120.0, key: 0.7}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    curve = async_vs_sync.accuracy_over_time(tmp_path)
    assert curve == [(-5.0, 0.5), (10.0, 0.8), (20.0, 0.7)]
    assert async_vs_sync.time_to_reach(curve, 0.75) == 10.0
    assert async_vs_sync.time_to_reach(curve, 0.9) is None


def test_the_layouts_size_the_split_pools_and_give_colocated_sync_every_device():
    sized = async_vs_sync.layouts(4, 2)
    split = ["actor_rollout_ref.hybrid_engine=false", "trainer.n_gpus_per_node=4", "rollout.n_gpus_per_node=2"]
    assert sized["colocated sync"] == ["trainer.n_gpus_per_node=6"]
    assert sized["split sync"] == split
    assert sized["one step off"] == [*split, "async_training.mode=one_step_off"]
    assert sized["streaming"][:3] == split and "async_training.mode=streaming" in sized["streaming"]
    # the two cores' layouts are the learning comparison's
    two_cores = async_vs_sync.layouts(1, 1)
    assert two_cores["one step off"] == async_vs_sync.ONE_STEP_OFF and two_cores["streaming"] == async_vs_sync.STREAMING
