"""One step off the policy (async_training.mode=one_step_off): the rollout pool generates each step's batch with
the weights of the update before the last while the training pool trains, the stale samples are corrected, and a
run resumed from a checkpoint trains on exactly the batch that was in flight when it was saved."""

import pytest
from ppo_helpers import ppo_config, tiny_run_overrides
from test_ppo_e2e import DETERMINISTIC

from hybridrl.trainer.main_ppo import run_ppo

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

ONE_STEP_OFF = ["trainer.n_gpus_per_node=1", "actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1",
                "async_training.mode=one_step_off"]


def test_each_batch_is_one_update_old_corrected_and_resumes_exactly(arithmetic_data, tiny_model_dir, tmp_path):
    base = tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "run")
    # lr 1e-2: updates large enough that one update's difference shows in the log-probs
    lr = "actor_rollout_ref.actor.optim.lr=1e-2"
    history = run_ppo(ppo_config(*base, *ONE_STEP_OFF, lr, "trainer.total_training_steps=4", "trainer.save_freq=2",
                                 "trainer.test_freq=2"))
    assert [m["training/global_step"] for m in history] == [1, 2, 3, 4]
    # step 1 and 2 were both sampled before any update; from then on every batch is exactly one update old
    assert [m["rollout/weight_version"] for m in history] == [0, 0, 1, 2]
    assert [m["rollout/weight_staleness"] for m in history] == [0, 1, 1, 1]
    assert [m["async/staleness_max"] for m in history] == [0, 1, 1, 1]
    assert [m["async/queue_size"] for m in history] == [1, 1, 1, 0]  # the last step starts nothing
    assert "val-core/arithmetic/reward/mean@1" in history[1]
    for metrics in history:
        assert metrics["timing_s/trainer_idle"] >= 0 and metrics["timing_s/rollout_idle"] >= 0
        assert "rollout_corr/rollout_is_mean" in metrics  # the default truncated IS weights
    # fp32: on-policy rows agree to rounding; rows sampled one update ago do not
    assert history[0]["rollout/log_prob_diff_max"] <= 1e-5
    assert min(m["rollout/log_prob_diff_max"] for m in history[1:]) > 1e-4

    # resumed from step 2's checkpoint: it holds step 3's batch (sampled with version 1), which the resumed run
    # trains on instead of generating it again, so steps 3 and 4 repeat to the bit
    again = tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "resumed")
    resumed = run_ppo(ppo_config(*again, *ONE_STEP_OFF, lr, "trainer.total_training_steps=4",
                                 "trainer.resume_mode=resume_path",
                                 f"trainer.resume_from_path={tmp_path / 'run' / 'global_step_2'}"))
    assert [m["training/global_step"] for m in resumed] == [3, 4]
    assert [m["rollout/weight_version"] for m in resumed] == [1, 2]
    for key in [*DETERMINISTIC, "rollout_corr/rollout_is_mean"]:
        assert [m[key] for m in resumed] == [m[key] for m in history[2:]], key

    # the same checkpoint resumed synchronously: the saved batch still trains next (no prompt skipped), and from
    # then on each batch is sampled with the newest weights
    sync = run_ppo(ppo_config(*tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "sync"),
                              *ONE_STEP_OFF[:3], lr, "trainer.total_training_steps=4", "trainer.resume_mode=resume_path",
                              f"trainer.resume_from_path={tmp_path / 'run' / 'global_step_2'}"))
    assert [m["rollout/weight_version"] for m in sync] == [1, 3]
    assert [m["rollout/weight_staleness"] for m in sync] == [1, 0]
    assert "rollout_corr/rollout_is_mean" not in sync[0]  # synchronous: nothing filled in to correct
