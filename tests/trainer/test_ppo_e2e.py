"""End to end: GRPO steps with 2 Ray workers, the checkpoint layout, and exact resume."""

import json

import pytest
from ppo_helpers import FIXTURES, ppo_config, tiny_run_overrides

from hybridrl.trainer.main_ppo import run_ppo

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

# Quantities that depend only on the data, the weights and the seeds (not on wall-clock time).
DETERMINISTIC = ["critic/score/mean", "critic/advantages/max", "actor/pg_loss", "actor/entropy",
                 "actor/grad_norm", "actor/kl_loss", "response_length/mean", "rollout/log_prob_diff_max"]

EXPECTED_KEYS = {
    "critic/score/mean", "critic/rewards/mean", "critic/advantages/mean", "critic/returns/mean",
    "response_length/mean", "response_length/clip_ratio", "prompt_length/mean", "actor/pg_loss",
    "actor/entropy", "actor/pg_clipfrac", "actor/ppo_kl", "actor/kl_loss", "actor/grad_norm", "actor/lr",
    "timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor", "timing_s/step",
    "timing_per_token_ms/gen", "perf/throughput", "perf/max_memory_rss_gb", "rollout/log_prob_diff_max",
    "timing_s/gen_worker", "timing_s/old_log_prob_worker", "timing_s/ref_worker", "timing_s/update_actor_worker",
    "perf/mfu/rollout", "perf/mfu/actor_infer", "perf/mfu/ref", "perf/mfu/actor",
    "perf/max_memory_rss_gb/worker_max", "perf/max_memory_rss_gb/workers_sum",
    "perf/max_memory_rss_gb/all_processes",
}


def test_grpo_on_two_ray_workers_saves_and_resumes_exactly(arithmetic_data, tiny_model_dir, tmp_path):
    base = tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "full")
    full = run_ppo(ppo_config(*base, "trainer.total_training_steps=3", "trainer.save_freq=2"))
    assert [m["training/global_step"] for m in full] == [1, 2, 3]
    assert set(full[-1]) >= EXPECTED_KEYS, EXPECTED_KEYS - set(full[-1])
    assert full[0]["rollout/log_prob_diff_max"] < 1e-4  # the rollout sampled with the trained weights
    step = full[-1]
    # two worker processes besides the driver, each holding a model: the sum covers both
    assert step["perf/max_memory_rss_gb/workers_sum"] > step["perf/max_memory_rss_gb/worker_max"] > 0
    assert step["perf/max_memory_rss_gb/all_processes"] == pytest.approx(
        step["perf/max_memory_rss_gb/workers_sum"] + step["perf/max_memory_rss_gb"])
    # the slowest rank's own time lies inside the driver's, which adds dispatch and transfer
    assert 0 < step["timing_s/update_actor_worker"] < step["timing_s/update_actor"]

    run = tmp_path / "full"
    assert (run / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    for step in (2, 3):
        assert (run / f"global_step_{step}" / "actor" / "huggingface" / "config.json").exists()
        assert (run / f"global_step_{step}" / "data.pt").exists()
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in logged] == [1, 2, 3]

    # Stop after step 2, then resume from its checkpoint and run step 3.
    split = [o for o in tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "split")
             if not o.startswith("trainer.val_before_train")]
    run_ppo(ppo_config(*split, "trainer.total_training_steps=2", "trainer.save_freq=2"))
    # verl validates again on resume (val_before_train); that must not disturb the training stream
    resumed = run_ppo(ppo_config(*split, "trainer.total_training_steps=3", "trainer.save_freq=2",
                                 "trainer.val_before_train=true"))
    assert [m["training/global_step"] for m in resumed] == [2, 3]
    assert "val-core/arithmetic/reward/mean@1" in resumed[0]
    # metrics.jsonl keeps one line per step: the resumed run's validation joined step 2's line
    logged = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in logged] == [0, 1, 2, 3]
    assert {"actor/pg_loss", "val-core/arithmetic/reward/mean@1"} <= set(logged[2])
    resumed = resumed[1:]
    for key in DETERMINISTIC:
        assert resumed[0][key] == full[2][key], key


def test_a_reward_function_that_raises_stops_with_a_clear_error(arithmetic_data, tiny_model_dir, tmp_path):
    overrides = tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "bad")
    with pytest.raises(RuntimeError, match=r"reward function raised ValueError(.|\n)*reward_model.max_failure_share"):
        run_ppo(ppo_config(*overrides, "trainer.total_training_steps=1", "trainer.backend=local",
                           "trainer.n_gpus_per_node=1", f"custom_reward_function.path={FIXTURES / 'digit_reward.py'}",
                           "custom_reward_function.name=always_raises"))
