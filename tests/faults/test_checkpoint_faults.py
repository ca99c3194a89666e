"""Checkpoint faults (issue 19, items 4 and 5): a tracker moved back, runs that would overwrite committed
steps, and a truncated shard in the latest checkpoint.

Before: `echo 0 > latest_checkpointed_iteration.txt` made the next run train from scratch without a word,
overwrite global_step_1-3 and append duplicate steps to metrics.jsonl; a truncated shard stopped resume
with `CheckpointException ranks:[0]`, naming no file. Now each is an error naming the files involved, or
a warning and a fallback to the previous committed step, and nothing already written is lost.

One 2-step run with a checkpoint per step (the module's `saved_run`) is copied for each test.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import pytest
from fault_helpers import fault_run_overrides, ppo_config

from hybridrl.trainer.main_ppo import run_ppo
from hybridrl.workers.checkpoint import TRACKER_FILE, CheckpointError

SHARD = Path("global_step_2") / "actor" / "__0_0.distcp"  # rank 0's model + optimizer shard (DCP)


@pytest.fixture(scope="module")
def saved_run(fault_data, tiny_model_dir, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("saved") / "run"
    run_ppo(ppo_config(*fault_run_overrides(fault_data, tiny_model_dir, run), "trainer.save_freq=1"))
    return run


@pytest.fixture
def run_copy(saved_run, tmp_path) -> Path:
    return shutil.copytree(saved_run, tmp_path / "run")


def overrides(fault_data, tiny_model_dir, run: Path, *extra: str) -> list[str]:
    return [*fault_run_overrides(fault_data, tiny_model_dir, run), "trainer.save_freq=1", *extra]


def digest(directory: Path) -> dict[str, str]:
    """Every file under `directory` by relative path -> sha256 of its bytes."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def steps_logged(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_a_tracker_below_the_saved_steps_is_an_error_naming_both(run_copy, fault_data, tiny_model_dir):
    (run_copy / TRACKER_FILE).write_text("0\n")
    before = digest(run_copy)
    with pytest.raises(CheckpointError, match=rf"{TRACKER_FILE} says step 0, but global_step_2, global_step_1 "
                       r"above it were committed.*echo 2 >"):
        run_ppo(ppo_config(*overrides(fault_data, tiny_model_dir, run_copy, "trainer.total_training_steps=3")))
    assert digest(run_copy) == before  # no step trained again, no line appended to metrics.jsonl


@pytest.mark.parametrize("resume", [["trainer.resume_mode=disable"],
                                    ["trainer.resume_mode=resume_path", "trainer.resume_from_path={run}/global_step_1"]])
def test_a_run_that_would_save_over_committed_steps_does_not_start(run_copy, fault_data, tiny_model_dir, resume):
    before = digest(run_copy)
    resume = [item.format(run=run_copy) for item in resume]
    with pytest.raises(CheckpointError, match=r"holds committed checkpoints global_step_2.* would overwrite them"):
        run_ppo(ppo_config(*overrides(fault_data, tiny_model_dir, run_copy, "trainer.total_training_steps=3",
                                      *resume)))
    assert digest(run_copy) == before


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_truncated_shard_is_named_and_resume_falls_back_to_the_previous_step(run_copy, fault_data,
                                                                                 tiny_model_dir, caplog):
    truncate(run_copy / SHARD)
    broken = digest(run_copy / "global_step_2")
    first_line = (run_copy / "metrics.jsonl").read_text().splitlines()[0]
    with caplog.at_level(logging.WARNING):
        history = run_ppo(ppo_config(*overrides(fault_data, tiny_model_dir, run_copy,
                                                "trainer.total_training_steps=3")))
    assert f"could not load the checkpoint {run_copy / 'global_step_2'}" in caplog.text
    assert str(run_copy / SHARD) in caplog.text  # the failing file itself is named
    assert [m["training/global_step"] for m in history] == [2, 3]  # resumed from step 1
    # the broken step was moved aside untouched, and steps 2 and 3 saved anew
    assert digest(run_copy / "global_step_2.unloadable") == broken
    assert (run_copy / TRACKER_FILE).read_text() == "3"
    assert sorted(p.name for p in run_copy.glob("global_step_*")) == \
        ["global_step_1", "global_step_2", "global_step_2.unloadable", "global_step_3"]
    # one line per step; the first run's line of step 2 is kept aside, not lost
    assert steps_logged(run_copy / "metrics.jsonl") == [1, 2, 3]
    assert (run_copy / "metrics.jsonl").read_text().splitlines()[0] == first_line
    assert steps_logged(run_copy / "metrics.jsonl.rolled_back") == [2]


def test_an_explicit_resume_path_that_fails_to_load_is_an_error_naming_it(run_copy, fault_data, tiny_model_dir):
    truncate(run_copy / SHARD)
    before = digest(run_copy)
    with pytest.raises(CheckpointError, match=rf"could not load the checkpoint {run_copy / 'global_step_2'}: "
                       rf".*{SHARD.name}"):
        run_ppo(ppo_config(*overrides(fault_data, tiny_model_dir, run_copy, "trainer.total_training_steps=3",
                                      "trainer.resume_mode=resume_path",
                                      f"trainer.resume_from_path={run_copy / 'global_step_2'}")))
    assert digest(run_copy) == before
