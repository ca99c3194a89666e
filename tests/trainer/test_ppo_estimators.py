"""Every estimator family runs a real training step through the one uniform path (local backend).

GAE brings a critic, ReMax a greedy baseline, DAPO's filter_groups regenerates until the batch holds
only prompts whose samples differ, and KL in the reward goes through the controller.
"""

import math

import pytest
from ppo_helpers import ppo_config, tiny_run_overrides

from hybridrl.trainer.main_ppo import run_ppo
from hybridrl.utils.device import native_bf16

LOCAL = ["trainer.backend=local", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=1"]
BF16_WHERE_NATIVE = "bfloat16" if native_bf16("cpu") else "float32"


@pytest.mark.parametrize("extra, expected_keys", [
    (["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=8"],
     {"critic/vf_loss", "critic/values/mean", "critic/vf_explained_var", "timing_s/update_critic"}),
    (["algorithm.adv_estimator=remax"], {"timing_s/gen_baseline"}),
    (["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=8", "algorithm.use_pf_ppo=true"],
     {"train/pf_ppo_distinct_rows", "critic/vf_loss"}),
    (["algorithm.adv_estimator=rloo"], {"actor/pg_loss"}),
    (["algorithm.adv_estimator=optimal_token_baseline", "actor_rollout_ref.actor.calculate_sum_pi_squared=true",
      "actor_rollout_ref.actor.ppo_mini_batch_size=4"],  # one mini-batch: only the estimator keeps the pass
     {"timing_s/old_log_prob"}),
    (["algorithm.adv_estimator=reinforce_plus_plus", "algorithm.use_kl_in_reward=true",
      "algorithm.kl_ctrl.type=adaptive"], {"actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"}),
    (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=10"],
     {"train/num_gen_batches"}),
    # bf16 compute where the CPU has it (fp32 elsewhere), for every model of the step
    ([f"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype={BF16_WHERE_NATIVE}",
      f"actor_rollout_ref.rollout.dtype={BF16_WHERE_NATIVE}",
      f"actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype={BF16_WHERE_NATIVE}", "algorithm.adv_estimator=gae",
      f"critic.model.fsdp_config.mixed_precision.param_dtype={BF16_WHERE_NATIVE}", "critic.ppo_micro_batch_size_per_gpu=8"],
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


@pytest.mark.parametrize("loss_mode", ["importance_sampling", "up", "cispo", "sapo", "dppo_tv", "dppo_kl",
                                       "geo_mean", "topr"])
def test_one_step_per_added_policy_loss(arithmetic_data, tiny_model_dir, tmp_path, loss_mode):
    # two mini-batches per step, so the second one trains on a ratio that has moved away from 1
    overrides = tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "run")
    history = run_ppo(ppo_config(*overrides, *LOCAL, f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}"))
    step = history[-1]
    assert step["actor/grad_norm"] > 0 and math.isfinite(step["actor/pg_loss"])
    assert step["actor/old_log_prob_fused"] == 0.0  # the separate old log-prob pass ran


def test_gdpo_step_normalises_each_reward_component(arithmetic_data, tiny_model_dir, tmp_path):
    overrides = tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "run")
    overrides = [o for o in overrides if not o.startswith("algorithm.adv_estimator")]
    gdpo = ["algorithm.adv_estimator=gdpo", "custom_reward_function.name=digit_components",
            "algorithm.gdpo_reward_keys=[digit_share,brevity]", "algorithm.gdpo_reward_weights=[1.0,0.5]"]
    step = run_ppo(ppo_config(*overrides, *LOCAL, *gdpo))[-1]
    assert step["actor/grad_norm"] > 0
    assert abs(step["critic/advantages/mean"]) < 1e-5  # whitened over the batch's valid tokens
    with pytest.raises(ValueError, match="'length' .*algorithm.gdpo_reward_keys"):
        run_ppo(ppo_config(*overrides, *LOCAL, *gdpo[:2], "algorithm.gdpo_reward_keys=[digit_share,length]",
                           f"trainer.default_local_dir={tmp_path / 'missing'}"))
