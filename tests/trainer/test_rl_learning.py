"""Slow learning tests: GRPO, PPO with a critic (GAE) and RLOO each raise the held-out greedy accuracy of
the quickstart's SFT model by 10 points or more, with the quickstart's settings and seed (30 steps, its
precision: bf16 where the CPU multiplies it natively).

The SFT model copied its teacher's slip (a dropped minus sign on most negative results, see
test_sft_learning); the exact-answer reward penalises it, so RL has something to learn that carries
over to held-out problems. Accuracy is measured outside the trainer (`model.generate` on the saved HF
model, scored by the task's scorer) and compared with the trainer's own validation metric.

Which SFT model the suite gets depends on the CPU's order of sums, and the RL gain depends on that
model. Measured on an AMD EPYC (2026-11-27) with this test's runs from 8 SFT models of seeds 0-3 (each
seed's SFT with MKL's fp32 sums and with oneDNN's, standing in for another CPU's), gains GRPO / RLOO /
GAE with 5 critic warm-up steps (GAE with the critic's prompts shared, as now; padded it gained within
0.01 of these):

    seed 0: 0.726, 125 sign slips: +0.256 / +0.250 / +0.248    0.720, 108: +0.196 / +0.188 / +0.204
    seed 1: 0.744, 120:            +0.238 / +0.236 / +0.234    0.742, 115: +0.224 / +0.220 / +0.226
    seed 2: 0.688,  86:            +0.092 / +0.084 / +0.070    0.738,  81: +0.124 / +0.108 / +0.126
    seed 3: 0.732, 128:            +0.244 / +0.240 / +0.252    0.738, 129: +0.244 / +0.242 / +0.250

with at most 21% of the sign slips left (18 of 86 with the padded critic, 16 shared), mostly none. A
model with fewer sign slips has less to gain (seed 2), so the test keeps the quickstart's seed 0 (+0.188
at least) and also checks the mechanism: the sign slips mostly gone. The recipe this test ran before, 20 fp32 steps, left GAE at
+0.004 / +0.016 from two of those models (its critic was still fitting the mean reward) and GRPO at
+0.054 from one: too close to the line for a test that other CPUs run.
"""

from __future__ import annotations

import pytest
from learning import accuracy, greedy_answers, sign_slips
from ppo_helpers import ppo_config

from hybridrl.data.sft_dataset import read_parquet_rows
from hybridrl.quickstart import GRPO_RECIPE, precision_overrides
from hybridrl.trainer.main_ppo import run_ppo

# Longer hang limit than the suite's 600 s: the shared SFT fixture may run in this module's first setup.
pytestmark = [pytest.mark.slow, pytest.mark.learning, pytest.mark.ray, pytest.mark.usefixtures("ray_cluster"),
              pytest.mark.timeout(1800)]

STEPS = 30  # the quickstart's
MARGIN = 0.10  # the quickstart's promise; measured minimum from two seed-0 SFT models +0.188
SLIPS_LEFT = 0.25  # at most this share of the SFT model's sign slips may remain (measured: none remain)


def held_out(model_dir, rows: list[dict]) -> tuple[float, int]:
    """(greedy accuracy, sign slips: negative results answered right but for the minus sign)."""
    texts = greedy_answers(model_dir, rows)
    return accuracy(rows, texts), sign_slips(rows, texts)


@pytest.fixture(scope="module")
def before(quickstart_sft) -> tuple[float, int]:
    data, model_dir = quickstart_sft
    return held_out(model_dir, read_parquet_rows(data / "test.parquet"))


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
        f"actor_rollout_ref.model.path={model_dir}", f"algorithm.adv_estimator={estimator}", "data.seed=0", *GRPO_RECIPE,
        f"trainer.total_training_steps={STEPS}", f"trainer.default_local_dir={run_dir}",
        "trainer.val_before_train=false", f"trainer.test_freq={STEPS}", f"trainer.save_freq={STEPS}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]", "trainer.logger=[file]",
        *precision_overrides(extra), *extra,
    ))
    (accuracy_before, slips_before), rows = before, read_parquet_rows(data / "test.parquet")
    accuracy_after, slips_after = held_out(run_dir / f"global_step_{STEPS}" / "actor" / "huggingface", rows)
    trainer_says = history[-1]["val-core/arithmetic/reward/mean@1"]
    print(f"{estimator}: held-out greedy accuracy {accuracy_before:.3f} -> {accuracy_after:.3f} (trainer's validation "
          f"{trainer_says:.3f}); sign slips {slips_before} -> {slips_after}")
    # The trainer validates greedily with the rollout in the run's precision, model.generate here in fp32:
    # near-tied tokens can go either way in bf16 (measured |difference| <= 0.014 over 15 runs; fp32: <= 0.01).
    assert abs(trainer_says - accuracy_after) <= 0.02
    assert slips_after <= SLIPS_LEFT * slips_before
    assert accuracy_after >= accuracy_before + MARGIN
