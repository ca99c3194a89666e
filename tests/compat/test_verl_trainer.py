"""verl's trainer-level names in compat/verl_trainer.py: compute_advantage with the settings as arguments,
its multi-output session variant, ResourcePoolManager, and the rollout-correction presets."""

import pytest
import torch
from ppo_helpers import scored_batch
from verl_trainer import (
    ResourcePoolManager,
    RolloutCorrectionConfig,
    compute_advantage,
    compute_advantage_for_multi_trajectories,
)

from hybridrl.algos.rollout_correction import compute_policy_loss_bypass_mode
from hybridrl.protocol import DataProto
from hybridrl.trainer import dataflow
from hybridrl.trainer.ppo_config import AlgorithmConfig
from hybridrl.workers.config import ActorConfig


def test_verls_compute_advantage_takes_settings_as_arguments_or_from_the_config():
    data = scored_batch([0.0, 4.0], [[1, 1], [1, 1]], ["p", "q"])
    compute_advantage(data, "reinforce_plus_plus", gamma=0.5)
    # row 1 returns: 0.5 * 4 = 2 then 4
    torch.testing.assert_close(data.batch["returns"][1], torch.tensor([2.0, 4.0]))
    compute_advantage(data, "reinforce_plus_plus")  # verl's default gamma 1: 4 then 4
    torch.testing.assert_close(data.batch["returns"][1], torch.tensor([4.0, 4.0]))
    compute_advantage(data, "reinforce_plus_plus", config=AlgorithmConfig(gamma=0.5))
    torch.testing.assert_close(data.batch["returns"][1], torch.tensor([2.0, 4.0]))
    with pytest.raises(ValueError, match="gamma=0.9 was passed but config.gamma is 0.5"):
        compute_advantage(data, "reinforce_plus_plus", gamma=0.9, config=AlgorithmConfig(gamma=0.5))


def test_multi_trajectory_grpo_groups_the_final_output_of_each_session():
    # session a0 has outputs 0 and 1 (rows 0, 1); sessions a1 and a2 one output each
    data = scored_batch([9.0, 1.0, 3.0, 2.0], [[1, 1], [0, 1], [1, 0], [1, 1]], ["a"] * 4)
    keys = ["a_0_0", "a_0_1", "a_1_0", "a_2_0"]
    compute_advantage_for_multi_trajectories(data, keys, "grpo")
    # the group is the finals: scores 1 (row 1), 3, 2 -> mean 2, std 1 -> -1, +1, 0; row 0 takes its
    # session's -1 on its own response tokens (its score 9 is not a final output and counts for nothing)
    expected = torch.tensor([[-1.0, -1.0], [0.0, -1.0], [1.0, 0.0], [0.0, 0.0]])
    torch.testing.assert_close(data.batch["advantages"], expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="form"):
        compute_advantage_for_multi_trajectories(data, ["a", "b", "c", "d"], "grpo")


def test_resource_pool_manager_maps_roles():
    with pytest.raises(ValueError, match="undefined pools"):
        ResourcePoolManager({"global_pool": [2]}, {"actor": "other_pool"})
    manager = ResourcePoolManager({"global_pool": [1]}, {"actor": "global_pool", "critic": "global_pool"})
    assert manager.get_n_processes() == 1
    with pytest.raises(KeyError, match="'reward'"):
        manager.get_resource_pool("reward")


PRESETS = ["decoupled_token_icepop", "decoupled_geo_rs_seq_tis", "bypass_ppo_clip", "decoupled_token_is",
           "decoupled_seq_is", "decoupled_seq_is_rs", "decoupled_geo_rs", "decoupled_geo_rs_token_tis",
           "decoupled_k3_rs", "decoupled_k3_rs_seq_tis", "decoupled_k3_rs_token_tis", "bypass_ppo_clip_geo_rs",
           "bypass_ppo_clip_k3_rs", "bypass_pg_is", "bypass_pg_geo_rs", "bypass_pg_geo_rs_seq_tis",
           "bypass_pg_geo_rs_token_tis", "disabled"]


def test_a_preset_by_hand():
    icepop = RolloutCorrectionConfig.decoupled_token_icepop()
    assert (icepop.rollout_is, icepop.rollout_is_threshold, icepop.rollout_rs) == ("token", "0.5_5.0", None)


@pytest.mark.parametrize("preset", PRESETS)
def test_verls_presets_are_valid_and_run_where_they_say(preset):
    config = getattr(RolloutCorrectionConfig, preset)()  # __post_init__ checks the combination
    assert config.bypass_mode == preset.startswith("bypass")
    assert (config.loss_type == "reinforce") == preset.startswith("bypass_pg")
    # x = old - rollout = [[0.5, 0, -1.5], [0.1, 2.0, pad]]
    rollout = torch.tensor([[-1.5, -0.5, -0.5], [-0.3, -3.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    data = DataProto.from_dict({"response_mask": mask, "rollout_log_probs": rollout,
                                "old_log_probs": torch.tensor([[-1.0, -0.5, -2.0], [-0.2, -1.0, 0.0]])})
    if config.bypass_mode:
        log_prob = (rollout + 0.01).requires_grad_(True)
        loss, metrics = compute_policy_loss_bypass_mode(rollout, log_prob, torch.ones_like(rollout), mask,
                                                        "token-mean", ActorConfig(), config)
        assert torch.isfinite(loss) and "rollout_corr/kl" in metrics
    elif config.enabled:
        dataflow.correct_rollout(data, config)
        assert ("rollout_is_weights" in data.batch) == (config.rollout_is is not None)
