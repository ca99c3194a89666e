"""Reward functions that raise, exit, hang, return NaN or a wrong type, in a real (few-second) GRPO run.

Each probe must end in a counted, logged skip (the step's rows score 0.0 and `reward/*` counts them in
metrics.jsonl) or, above `reward_model.max_failure_share` or on a fatal error, in a clear error --
never in a silent zero, a NaN step or a dead driver -- and what was written before stays.

The reward file is written by each test; it picks its behaviour by the prompt's `extra_info.index`.
With `data.shuffle=false` step 1 scores prompts 0-3 and step 2 prompts 4-7, 4 samples each.
"""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path

import pytest
from fault_helpers import fault_run_overrides, ppo_config

from hybridrl.rewards.failures import RewardFailureError, RewardFunctionFatalError
from hybridrl.trainer.main_ppo import run_ppo

REWARD_FILE = '''
import math, os, time

from hybridrl.rewards import RewardFunctionFatalError

BEHAVIOUR = {BEHAVIOUR}

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    action = BEHAVIOUR.get(extra_info["index"], "ok")
    if action == "raise":
        raise ValueError("the scorer has a bug")
    if action == "exit":
        os._exit(1)
    if action == "hang":
        time.sleep(60)
    if action == "nan":
        return math.nan
    if action == "text":
        return "0.5"
    if action == "fatal":
        raise RewardFunctionFatalError("the verifier service is unreachable; start it and rerun")
    return sum(ch in str(ground_truth) for ch in solution_str) / max(len(solution_str), 1)
'''

GUARD = ["data.shuffle=false", "reward_model.reward_fn_timeout=1", "reward_model.reward_fn_workers=2"]


def _reward_file(tmp_path: Path, behaviour: dict[int, str]) -> str:
    path = tmp_path / "reward.py"
    path.write_text(textwrap.dedent(REWARD_FILE).replace("{BEHAVIOUR}", repr(behaviour)))
    return f"custom_reward_function.path={path}"


def _metric_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_raise_exit_hang_nan_and_wrong_type_are_counted_and_logged_and_the_run_goes_on(
        fault_data, tiny_model_dir, tmp_path, caplog):
    run_dir = tmp_path / "run"
    behaviour = {0: "raise", 1: "exit", 2: "hang", 4: "nan", 5: "text"}  # prompts 3, 6, 7 score normally
    overrides = [*fault_run_overrides(fault_data, tiny_model_dir, run_dir), *GUARD, _reward_file(tmp_path, behaviour),
                 "reward_model.max_failure_share=0.8"]  # step 1 loses 12 of 16 rows, step 2 8 of 16
    with caplog.at_level(logging.WARNING, logger="hybridrl.rewards.failures"):
        history = run_ppo(ppo_config(*overrides))
    assert len(history) == 2
    steps = _metric_lines(run_dir)
    counts = [{k: step[f"reward/{k}"] for k in ("errors", "crashes", "timeouts", "non_finite", "wrong_type")}
              for step in steps]
    # 4 samples per prompt: one prompt per kind of failure
    assert counts == [{"errors": 4, "crashes": 4, "timeouts": 4, "non_finite": 0, "wrong_type": 0},
                      {"errors": 0, "crashes": 0, "timeouts": 0, "non_finite": 4, "wrong_type": 4}]
    assert [step["reward/failure_share"] for step in steps] == [0.75, 0.5]
    for step in steps:  # the failed rows' 0.0 kept every training metric finite
        assert all(value == value for value in step.values() if isinstance(value, float)), step
    # only the reward logger's: a busy machine adds other warnings (fewer torch threads)
    logs = [record.getMessage() for record in caplog.records if record.name == "hybridrl.rewards.failures"]
    assert len(logs) == 5  # the first failure of each kind in each step
    assert any("failed as error" in log and "ValueError: the scorer has a bug" in log and "reward.py" in log
               for log in logs)
    assert any("failed as crash" in log and "exit code 1" in log for log in logs)
    assert any("failed as timeout" in log and "time.sleep(60)" not in log and "in compute_score" in log
               for log in logs)  # the hung stack names the function


def test_a_step_over_the_failure_share_stops_the_run_and_keeps_what_was_written(
        fault_data, tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    behaviour = {4: "nan", 5: "nan", 6: "nan", 7: "nan"}  # step 1 is fine, step 2 returns NaN everywhere
    overrides = [*fault_run_overrides(fault_data, tiny_model_dir, run_dir), *GUARD, _reward_file(tmp_path, behaviour),
                 "trainer.save_freq=1"]  # default reward_model.max_failure_share (0.1)
    with pytest.raises(RewardFailureError) as caught:
        run_ppo(ppo_config(*overrides))
    message = str(caught.value)
    assert "> reward_model.max_failure_share=0.1 (non_finite=" in message
    assert "returned a non-finite score: the returned value is nan" in message
    assert "raise reward_model.max_failure_share" in message
    # step 1's metrics line and checkpoint stay
    assert [step["step"] for step in _metric_lines(run_dir)] == [1]
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    assert (run_dir / "global_step_1" / "actor").is_dir()


def test_a_fatal_error_from_the_reward_function_stops_the_run_at_once(fault_data, tiny_model_dir, tmp_path):
    behaviour = {2: "fatal"}
    overrides = [*fault_run_overrides(fault_data, tiny_model_dir, tmp_path / "run"), *GUARD,
                 _reward_file(tmp_path, behaviour), "reward_model.max_failure_share=1.0"]  # share plays no part
    with pytest.raises(RewardFunctionFatalError, match="verifier service is unreachable") as caught:
        run_ppo(ppo_config(*overrides))
    assert "reward.py" in "\n".join(caught.value.__notes__)  # where it was raised


def test_validation_counts_reward_failures_too(fault_data, tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    behaviour = {0: "raise", 1: "nan"}  # 2 of the 8 held-out prompts, one sample each
    overrides = [*fault_run_overrides(fault_data, tiny_model_dir, run_dir), *GUARD, _reward_file(tmp_path, behaviour),
                 "reward_model.max_failure_share=0.5", "trainer.val_before_train=true", "trainer.val_only=true"]
    (metrics,) = run_ppo(ppo_config(*overrides))
    assert (metrics["val-aux/reward/errors"], metrics["val-aux/reward/non_finite"]) == (1, 1)
    assert metrics["val-aux/reward/failure_share"] == 0.25  # 2 of 8
    assert metrics["val-core/arithmetic/reward/mean@1"] == metrics["val-core/arithmetic/reward/mean@1"]  # not NaN


def test_a_function_that_hangs_on_every_row_stops_the_run_after_one_timeout(fault_data, tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    behaviour = {4: "hang", 5: "hang", 6: "hang", 7: "hang"}  # step 1 is fine, step 2 hangs everywhere
    overrides = [*fault_run_overrides(fault_data, tiny_model_dir, run_dir), *GUARD, _reward_file(tmp_path, behaviour),
                 "trainer.save_freq=1", "reward_model.max_failure_share=0.5"]  # the share alone needs 9 timeouts
    with pytest.raises(RewardFailureError) as caught:
        run_ppo(ppo_config(*overrides))
    message = str(caught.value)
    # the two workers' first calls timed out (one timeout each, side by side) and the other 14 never ran
    assert "the reward function hangs: the first 2 calls of this batch of 16 rows all timed out" in message
    assert "the other 14 rows were not scored" in message
    assert "in compute_score" in message  # the hung stack
    assert "raise reward_model.reward_fn_timeout" in message
    assert [step["step"] for step in _metric_lines(run_dir)] == [1]  # step 1's line and checkpoint stay
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
