"""Slow learning tests: GRPO, PPO with a critic (GAE) and RLOO each raise the held-out greedy accuracy of
the quickstart's SFT model by 10 points or more, with the quickstart's settings and seed.

The SFT model copied its teacher's slip (a dropped minus sign on most negative results, see
test_sft_learning); the exact-answer reward penalises it, so RL has something to learn that carries
over to held-out problems. Accuracy is measured outside the trainer (`model.generate` on the saved HF
model, scored by the task's scorer) and compared with the trainer's own validation metric.

Measured on an AMD EPYC from the seed-0 SFT model (0.724 on the 500 held-out problems), 30 steps:
GRPO 0.982, RLOO 0.980, GAE with 5 critic warm-up steps 0.974; the sign slips fall from 129 to 0 while
the ~10 digit slips stay. The test runs 20 steps (the suite's time budget): GRPO 0.982, RLOO 0.984, GAE
0.970 from the same model (2026-11-25), a gain of +0.246 or more against the +0.10 asked. Over seeds 0-3 x 1 and 2 threads GRPO gained +0.136 to +0.258
(benchmarks/results/learning.md), so MARGIN is the smallest gain the recipe promises, not one run's.
"""

from __future__ import annotations

import pytest
from learning import greedy_accuracy
from ppo_helpers import ppo_config

from hybridrl.data.sft_dataset import read_parquet_rows
from hybridrl.trainer.main_ppo import run_ppo

# Longer hang limit than the suite's 600 s: the shared SFT fixture may run in this module's first setup.
pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(1800)]

STEPS = 20  # the quickstart trains 30; every estimator has its +10 points by step 20
MARGIN = 0.10  # the quickstart's promise; measured minimum over seeds and threads +0.136


@pytest.fixture(scope="module")
def before(quickstart_sft) -> float:
    data, model_dir = quickstart_sft
    return greedy_accuracy(model_dir, read_parquet_rows(data / "test.parquet"))


@pytest.mark.parametrize("estimator, extra", [
    ("grpo", []),
    ("rloo", []),
    ("gae", ["trainer.critic_warmup=5"]),
])
def test_rl_raises_held_out_greedy_accuracy(quickstart_sft, before, estimator, extra, tmp_path):
    data, model_dir = quickstart_sft
    run_dir = tmp_path / estimator
    history = run_ppo(ppo_config(
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
        f"actor_rollout_ref.model.path={model_dir}", f"algorithm.adv_estimator={estimator}", "data.seed=0",
        f"trainer.total_training_steps={STEPS}", f"trainer.default_local_dir={run_dir}",
        "trainer.val_before_train=false", f"trainer.test_freq={STEPS}", f"trainer.save_freq={STEPS}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]", "trainer.logger=[file]", *extra,
    ))
    after = greedy_accuracy(run_dir / f"global_step_{STEPS}" / "actor" / "huggingface",
                            read_parquet_rows(data / "test.parquet"))
    trainer_says = history[-1]["val-core/arithmetic/reward/mean@1"]
    print(f"{estimator}: held-out greedy accuracy {before:.3f} -> {after:.3f} (trainer's validation {trainer_says:.3f})")
    assert abs(trainer_says - after) <= 0.01  # the trainer's greedy validation is model.generate's greedy
    assert after >= before + MARGIN
