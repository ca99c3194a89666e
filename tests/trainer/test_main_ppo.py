"""run_ppo on the local backend: runs end clean, and every step reports worker times, MFU and memory.

Two runs back to back in one process (GRPO with a reference policy, then GAE with a critic) cover every
model stage between them; after each, and after a run that fails, no process group is open and the
distributed environment variables are as they were, which a child process confirms.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch.distributed as dist
from ppo_helpers import FIXTURES, ppo_config, random_reward_model, tiny_run_overrides

from hybridrl.controller.worker_group import DIST_ENV_KEYS
from hybridrl.trainer.main_ppo import run_ppo

LOCAL = ["trainer.backend=local", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=1"]
GAE = ["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=8"]


@pytest.fixture
def no_dist_env(monkeypatch):
    for key in DIST_ENV_KEYS:
        monkeypatch.delenv(key, raising=False)


def assert_clean() -> None:
    assert not dist.is_initialized()
    assert {k: os.environ.get(k) for k in DIST_ENV_KEYS} == dict.fromkeys(DIST_ENV_KEYS)


def child_dist_env() -> dict:
    code = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {DIST_ENV_KEYS!r}}}))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def assert_worker_stages(step: dict, stages_to_passes: dict[str, str]) -> None:
    for stage, model_pass in stages_to_passes.items():
        worker, driver = step[f"timing_s/{stage}_worker"], step[f"timing_s/{stage}"]
        assert 0 < worker <= driver, stage  # local backend: the worker's time lies inside the driver's
        mfu = step[f"perf/mfu/{model_pass}"]
        assert math.isfinite(mfu) and mfu > 0, model_pass


def test_two_runs_back_to_back_and_a_child_inherit_nothing(arithmetic_data, tiny_model_dir, tmp_path, no_dist_env):
    grpo = run_ppo(ppo_config(*tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "grpo"), *LOCAL,
                              "actor_rollout_ref.rollout.calculate_log_probs=false"))
    assert_clean()
    overrides = [o for o in tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "gae")
                 if not o.startswith("algorithm.adv_estimator")]
    # the GAE run scores its rule-based reward in the background (reward_model.launch_reward_fn_async)
    gae = run_ppo(ppo_config(*overrides, *LOCAL, *GAE, "reward_model.launch_reward_fn_async=true"))
    assert_clean()
    assert child_dist_env() == dict.fromkeys(DIST_ENV_KEYS)

    step = grpo[-1]
    assert_worker_stages(step, {"gen": "rollout", "old_log_prob": "actor_infer", "ref": "ref",
                                "update_actor": "actor"})
    assert "timing_s/update_actor_worker" in step and "worker_seconds" not in step
    assert_worker_stages(gae[-1], {"values": "critic_infer", "update_critic": "critic"})
    assert "timing_s/reward_wait" in gae[-1] and "timing_s/reward_wait" not in step
    # rollout.calculate_log_probs=false turns the rollout/trainer log-prob comparison off (on by default)
    assert "rollout/log_prob_diff_max" in gae[-1] and "rollout/log_prob_diff_max" not in step
    assert math.isfinite(gae[-1]["critic/score/mean"])
    # the local backend has one process: the driver is the worker, counted once
    rss = step["perf/max_memory_rss_gb"]
    assert rss > 0
    # (read a moment apart: the driver's peak may have grown by a page in between)
    assert step["perf/max_memory_rss_gb/workers_sum"] == pytest.approx(rss, rel=0.01)
    assert step["perf/max_memory_rss_gb/all_processes"] == rss


def test_a_failing_run_ends_clean_too(arithmetic_data, tiny_model_dir, tmp_path, no_dist_env):
    # the error comes from the background scoring thread, which ends with the run
    overrides = tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "bad")
    with pytest.raises(RuntimeError, match="reward function raised"):
        run_ppo(ppo_config(*overrides, *LOCAL, f"custom_reward_function.path={FIXTURES / 'digit_reward.py'}",
                           "custom_reward_function.name=always_raises", "reward_model.launch_reward_fn_async=true"))
    assert_clean()


@pytest.mark.gpu
@pytest.mark.parametrize("estimator", [[], GAE], ids=["grpo", "gae"])
def test_a_run_on_the_gpu_with_the_local_backend(arithmetic_data, tiny_model_dir, tmp_path, no_dist_env, estimator):
    # GRPO with a reference policy, or GAE with a critic: every model stage, on cuda:0 in this process
    overrides = [o for o in tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path)
                 if not (estimator and o.startswith("algorithm.adv_estimator"))]
    steps = run_ppo(ppo_config(*overrides, *LOCAL, *estimator, "trainer.device=cuda"))
    assert_clean()
    step = steps[-1]
    for key in ("actor/pg_loss", "actor/entropy", "critic/score/mean", "rollout/log_prob_diff_max"):
        assert math.isfinite(step[key]), key
    assert step["rollout/log_prob_diff_max"] < 1e-2  # the rollout and the actor score the same tokens alike


def test_device_cpu_keeps_every_stage_on_the_cpu_where_torch_sees_a_gpu(arithmetic_data, tiny_model_dir, tmp_path,
                                                                       no_dist_env, monkeypatch):
    # torch reports a GPU (none is here); trainer.device=cpu must still reach the worker, its engines and
    # its process group, so nothing asks CUDA for a device
    import torch

    from hybridrl.utils.device import DEVICE_ENV

    def no_cuda(*args, **kwargs):
        raise AssertionError("a CPU run touched CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", no_cuda)
    monkeypatch.setattr(torch.cuda, "current_device", no_cuda)
    monkeypatch.delenv(DEVICE_ENV, raising=False)  # only trainer.device says cpu, not the suite's pin
    steps = run_ppo(ppo_config(*tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path), *LOCAL,
                               "trainer.device=cpu"))
    assert_clean()
    assert math.isfinite(steps[-1]["actor/pg_loss"])
    assert DEVICE_ENV not in os.environ  # the local group's device went with it


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_run_scored_by_a_reward_model(arithmetic_data, tiny_model_dir, tmp_path, no_dist_env, device):
    # a model-based reward beside the rule-based one: the reward model's worker scores every response
    rm_dir = random_reward_model(tiny_model_dir, tmp_path / "rm")
    steps = run_ppo(ppo_config(*tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "run"), *LOCAL,
                               "reward_model.enable=true", f"reward_model.model.path={rm_dir}",
                               f"trainer.device={device}"))
    assert_clean()
    step = steps[-1]
    assert step["timing_s/reward"] > 0
    for key in ("actor/pg_loss", "critic/score/mean", "critic/rewards/mean"):
        assert math.isfinite(step[key]), key
    # the score is the model's (a real number per response), not the rule-based reward's few values
    assert step["critic/score/max"] > step["critic/score/min"]
