"""Every estimator family runs a real training step through the one uniform path (local backend).

GAE brings a critic, ReMax a greedy baseline, DAPO's filter_groups regenerates until the batch holds
only prompts whose samples differ, and KL in the reward goes through the controller.
"""

import pytest
from ppo_helpers import ppo_config, tiny_run_overrides

from hybridrl.trainer.main_ppo import run_ppo

LOCAL = ["trainer.backend=local", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=1"]


@pytest.mark.parametrize("extra, expected_keys", [
    (["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=8"],
     {"critic/vf_loss", "critic/values/mean", "critic/vf_explained_var", "timing_s/update_critic"}),
    (["algorithm.adv_estimator=remax"], {"timing_s/gen_baseline"}),
    (["algorithm.adv_estimator=rloo"], {"actor/pg_loss"}),
    (["algorithm.adv_estimator=reinforce_plus_plus", "algorithm.use_kl_in_reward=true",
      "algorithm.kl_ctrl.type=adaptive"], {"actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"}),
    (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=10"],
     {"train/num_gen_batches"}),
    # bf16 compute where the CPU has it (fp32 elsewhere), for every model of the step
    (["actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=auto", "actor_rollout_ref.rollout.dtype=auto",
      "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=auto", "algorithm.adv_estimator=gae",
      "critic.model.fsdp_config.mixed_precision.param_dtype=auto", "critic.ppo_micro_batch_size_per_gpu=8"],
     {"critic/vf_loss", "actor/kl_loss", "rollout/log_prob_diff_max"}),
])
def test_one_step_per_estimator_family(arithmetic_data, tiny_model_dir, tmp_path, extra, expected_keys):
    overrides = tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "run")
    overrides = [o for o in overrides if not o.startswith("algorithm.adv_estimator")]
    history = run_ppo(ppo_config(*overrides, *LOCAL, *extra))
    step = history[-1]
    assert step["training/global_step"] == 1
    assert expected_keys <= set(step), expected_keys - set(step)
    assert step["actor/grad_norm"] > 0  # the actor really updated
