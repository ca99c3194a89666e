"""GRPO with `rollout.name=vllm`: the rollout samples from the policy being trained, and the run learns.

These run where vllm is importable: the third-party CPU build lives in its own venv (the commands are in
requirements-vllm.txt); everywhere else they are skipped with that reason.

- With the weight hand-off, the sampler's log-probs match the trainer's to fp32 rounding at every step,
  even at a learning rate that moves the policy a lot each step. Without it (the control, on the local
  backend with the push patched out) vLLM samples from the starting model and the gap grows each step.
- From the quickstart's SFT model, GRPO with vLLM raises held-out greedy accuracy by the quickstart's
  margin, as test_rl_learning checks for the HF engine.
"""

from __future__ import annotations

import contextlib
import importlib.util

import pytest
from learning import greedy_accuracy
from ppo_helpers import ppo_config, tiny_run_overrides

from hybridrl.data.sft_dataset import read_parquet_rows
from hybridrl.trainer.main_ppo import run_ppo

HAS_VLLM = importlib.util.find_spec("vllm") is not None
NO_VLLM = "vllm is not installed: the CPU build runs in its own venv (requirements-vllm.txt)"

pytestmark = [pytest.mark.skipif(not HAS_VLLM, reason=NO_VLLM), pytest.mark.slow]

STEPS = 6
HIGH_LR = "actor_rollout_ref.actor.optim.lr=1e-2"
TOLERANCE = 1e-3  # fp32: rollout and trainer log-probs agree to ~1e-6; a stale engine is off by far more


def vllm_run(arithmetic_data, tiny_model_dir, run_dir, *extra: str) -> list[dict]:
    return run_ppo(ppo_config(
        *tiny_run_overrides(arithmetic_data, tiny_model_dir, run_dir), "actor_rollout_ref.rollout.name=vllm",
        HIGH_LR, f"trainer.total_training_steps={STEPS}", *extra,
    ))


@pytest.mark.ray
def test_grpo_with_vllm_samples_from_the_trained_policy(arithmetic_data, tiny_model_dir, tmp_path):
    history = vllm_run(arithmetic_data, tiny_model_dir, tmp_path / "run")  # 2 Ray workers, one engine each
    assert [m["training/global_step"] for m in history] == list(range(1, STEPS + 1))
    gaps = [m["rollout/log_prob_diff_max"] for m in history]
    print("rollout/log_prob_diff_max per step:", gaps)
    assert max(gaps) <= TOLERANCE


def test_grpo_with_lora_hands_vllm_the_merged_weights(arithmetic_data, tiny_model_dir, tmp_path):
    """vLLM holds a plain model: the actor's adapters reach it merged into the base weights at every step."""
    history = vllm_run(arithmetic_data, tiny_model_dir, tmp_path / "lora", "trainer.backend=local",
                       "trainer.n_gpus_per_node=1", "actor_rollout_ref.model.lora_rank=8")
    gaps = [m["rollout/log_prob_diff_max"] for m in history]
    print("rollout/log_prob_diff_max per step, LoRA:", gaps)
    assert max(gaps) <= 1e-5
    assert history[-1]["actor/kl_loss"] > 0  # the adapters trained away from the base


def test_without_the_hand_off_the_gap_grows(arithmetic_data, tiny_model_dir, tmp_path, monkeypatch):
    """The control: the same run with vLLM's weight push patched out shows the metric catches it."""
    from hybridrl.workers.rollout.vllm import VLLMRollout

    monkeypatch.setattr(VLLMRollout, "_serve_weights", lambda self, actor: contextlib.nullcontext())
    history = vllm_run(arithmetic_data, tiny_model_dir, tmp_path / "stale", "trainer.backend=local",
                       "trainer.n_gpus_per_node=1")
    gaps = [m["rollout/log_prob_diff_max"] for m in history]
    print("rollout/log_prob_diff_max per step, no hand-off:", gaps)
    assert gaps[0] <= TOLERANCE  # the first step samples from the starting model, which is still current
    assert gaps[-1] > 100 * TOLERANCE


@pytest.mark.ray
@pytest.mark.timeout(2400)  # the SFT warm start (~3.5 min on 2 idle cores) counts, and 30 GRPO steps
def test_grpo_with_vllm_raises_held_out_greedy_accuracy(quickstart_sft, tmp_path):
    """test_rl_learning's GRPO run with the vLLM engine: the same 30 steps, the same margin."""
    from test_rl_learning import MARGIN
    from test_rl_learning import STEPS as LEARNING_STEPS

    data, model_dir = quickstart_sft
    rows = read_parquet_rows(data / "test.parquet")
    before = greedy_accuracy(model_dir, rows)
    run_dir = tmp_path / "grpo-vllm"
    history = run_ppo(ppo_config(
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
        f"actor_rollout_ref.model.path={model_dir}", "algorithm.adv_estimator=grpo", "data.seed=0",
        "actor_rollout_ref.rollout.name=vllm", f"trainer.total_training_steps={LEARNING_STEPS}",
        f"trainer.default_local_dir={run_dir}", "trainer.val_before_train=false",
        f"trainer.test_freq={LEARNING_STEPS}", f"trainer.save_freq={LEARNING_STEPS}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]", "trainer.logger=[file]",
    ))
    after = greedy_accuracy(run_dir / f"global_step_{LEARNING_STEPS}" / "actor" / "huggingface", rows)
    trainer_says = history[-1]["val-core/arithmetic/reward/mean@1"]
    gaps = [m["rollout/log_prob_diff_max"] for m in history]
    print(f"grpo + vllm: held-out greedy accuracy {before:.3f} -> {after:.3f} (trainer's validation, "
          f"vLLM greedy: {trainer_says:.3f}); rollout/log_prob_diff_max <= {max(gaps):.2e}")
    assert max(gaps) <= TOLERANCE
    assert abs(trainer_says - after) <= 0.01  # vLLM's greedy validation is model.generate's greedy
    assert after >= before + MARGIN


@pytest.mark.ray
def test_grpo_with_vllm_on_a_rollout_pool_of_its_own(arithmetic_data, tiny_model_dir, tmp_path):
    """hybrid_engine=false: one training process, one vLLM process; the weights arrive by the weight sync."""
    history = vllm_run(arithmetic_data, tiny_model_dir, tmp_path / "split", "actor_rollout_ref.hybrid_engine=false",
                       "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1")
    gaps = [m["rollout/log_prob_diff_max"] for m in history]
    print("rollout/log_prob_diff_max per step, split:", gaps)
    assert max(gaps) <= 1e-5
    assert [m["rollout/weight_version"] for m in history] == list(range(STEPS))
