"""Old log-probs from the update's own forward pass on a fully on-policy step, the separate pass elsewhere."""

import pytest
from omegaconf import OmegaConf
from ppo_helpers import ppo_config, tiny_run_overrides

from hybridrl.trainer.dataflow import old_log_prob_blockers
from hybridrl.trainer.main_ppo import run_ppo

LOCAL = ["trainer.backend=local", "trainer.n_gpus_per_node=1"]
ONE_MINI_BATCH = "actor_rollout_ref.actor.ppo_mini_batch_size=4"  # = data.train_batch_size of the tiny run


def _blockers(*overrides: str) -> list[str]:
    base = ["data.train_files=train.parquet", "actor_rollout_ref.model.path=model", "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    return old_log_prob_blockers(OmegaConf.to_object(ppo_config(*base, *overrides)))


def test_each_key_that_needs_the_separate_pass_is_named():
    assert _blockers() == []
    for override, named in [
        ("actor_rollout_ref.actor.fuse_old_log_prob=false", "fuse_old_log_prob=false"),
        ("actor_rollout_ref.actor.ppo_epochs=2", "ppo_epochs=2"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size=4", "ppo_mini_batch_size=4"),
        ("algorithm.use_kl_in_reward=true", "use_kl_in_reward=true"),
        ("algorithm.rollout_correction.rollout_is=token", "rollout_correction.rollout_is"),
        ("algorithm.rollout_correction.bypass_mode=true", "bypass_mode=true"),
        ("algorithm.adv_estimator=optimal_token_baseline", "adv_estimator=optimal_token_baseline"),
    ]:
        reasons = _blockers(override)
        assert len(reasons) == 1 and named in reasons[0], (override, reasons)


def test_an_on_policy_step_takes_old_log_probs_from_the_update(arithmetic_data, tiny_model_dir, tmp_path):
    base = tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "run")
    fused = run_ppo(ppo_config(*base, *LOCAL, ONE_MINI_BATCH, "trainer.total_training_steps=2"))
    for step in fused:
        assert step["actor/old_log_prob_fused"] == 1.0
        assert "timing_s/old_log_prob" not in step  # no separate pass ran
        # the log-probs came back from the update: the rollout's agree with them (same weights, fp32)
        assert step["rollout/log_prob_diff_max"] < 1e-4
        assert step["actor/pg_clipfrac"] == 0.0 and step["actor/entropy"] > 0
    separate = run_ppo(ppo_config(*base, *LOCAL, "trainer.total_training_steps=1",
                                  f"trainer.default_local_dir={tmp_path / 'separate'}"))
    assert separate[0]["actor/old_log_prob_fused"] == 0.0 and "timing_s/old_log_prob" in separate[0]


@pytest.mark.slow
@pytest.mark.ray
def test_two_ray_ranks_return_the_update_s_old_log_probs(ray_cluster, arithmetic_data, tiny_model_dir, tmp_path):
    base = tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "run")
    history = run_ppo(ppo_config(*base, ONE_MINI_BATCH, "trainer.total_training_steps=1"))
    assert history[0]["actor/old_log_prob_fused"] == 1.0
    assert history[0]["rollout/log_prob_diff_max"] < 1e-4  # both ranks' rows came back in order
