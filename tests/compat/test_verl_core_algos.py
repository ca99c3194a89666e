"""verl's core_algos call conventions that the core leaves to compat/verl_core_algos.py."""

import math
from types import SimpleNamespace

import pytest
import torch
import verl_core_algos

from hybridrl.algos import (
    ADV_ESTIMATOR_REGISTRY,
    FixedKLController,
    apply_kl_penalty,
    compute_policy_loss_vanilla,
)
from hybridrl.algos.rollout_correction import compute_policy_loss_bypass_mode as core_bypass_mode
from hybridrl.trainer.ppo_config import RolloutCorrectionConfig
from hybridrl.workers.config import ActorConfig


def test_verls_deprecated_compute_policy_loss_is_vanilla_with_four_returns():
    torch.manual_seed(1)
    old, new, adv = torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.float32)
    with pytest.warns(DeprecationWarning, match="compute_policy_loss_vanilla"):
        loss, clipfrac, ppo_kl, clipfrac_lower = verl_core_algos.compute_policy_loss(
            old, new, adv, mask, cliprange=0.2, cliprange_high=0.28, clip_ratio_c=3.0)
    expected, metrics = compute_policy_loss_vanilla(old, new, adv, mask,
                                                    config=ActorConfig(clip_ratio_low=0.2, clip_ratio_high=0.28))
    torch.testing.assert_close(loss, expected)
    assert (clipfrac, ppo_kl, clipfrac_lower) == (metrics["pg_clipfrac"], metrics["ppo_kl"],
                                                  metrics["pg_clipfrac_lower"])
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="needs cliprange"):
        verl_core_algos.compute_policy_loss(old, new, adv, mask)


def test_registration_and_lookup_follow_a_rebound_registry(monkeypatch):
    # verl code may rebind core_algos.ADV_ESTIMATOR_REGISTRY to its own dict (verl's registry tests do)
    own: dict = {"gae": lambda x: 2 * x}
    monkeypatch.setattr(verl_core_algos, "ADV_ESTIMATOR_REGISTRY", own)

    @verl_core_algos.register_adv_est("test_elsewhere")
    def elsewhere(token_level_rewards, response_mask):
        return token_level_rewards, token_level_rewards

    assert own["test_elsewhere"] is elsewhere and "test_elsewhere" not in ADV_ESTIMATOR_REGISTRY
    assert verl_core_algos.get_adv_estimator_fn("gae")(5) == 10
    with pytest.raises(ValueError, match="Unknown advantage estimator simply: GAE"):
        verl_core_algos.get_adv_estimator_fn("GAE")
    with pytest.raises(ValueError, match="already registered"):
        verl_core_algos.register_adv_est("gae")(elsewhere)


def test_without_a_rebinding_the_core_registry_serves():
    assert verl_core_algos.get_adv_estimator_fn("grpo") is ADV_ESTIMATOR_REGISTRY["grpo"]


def test_verls_bypass_call_reads_its_options_on_the_actor_config():
    rollout = torch.tensor([[-1.0, -0.5, -2.0]])
    log_prob = (rollout + torch.tensor([[math.log(3.0), math.log(0.5), 0.0]])).requires_grad_(True)
    adv, mask = torch.tensor([[1.0, -2.0, 0.5]]), torch.ones(1, 3)
    options = {"loss_type": "reinforce", "rollout_is": "token", "rollout_is_threshold": 2.0}
    # verl's config: the bypass options under policy_loss.rollout_correction, loss_mode "bypass_mode"
    verl_config = SimpleNamespace(**vars(ActorConfig()))
    verl_config.policy_loss = SimpleNamespace(loss_mode="bypass_mode", rollout_correction=options)
    from_config, _ = verl_core_algos.compute_policy_loss_bypass_mode(rollout, log_prob, adv, mask, "token-mean",
                                                                     verl_config)
    expected, _ = core_bypass_mode(rollout, log_prob, adv, mask, "token-mean", ActorConfig(),
                                   RolloutCorrectionConfig(bypass_mode=True, **options))
    torch.testing.assert_close(from_config, expected)
    assert verl_config.policy_loss.loss_mode == "bypass_mode"  # the caller's config is left as it was
    with pytest.raises(ValueError, match="policy_loss.rollout_correction"):
        verl_core_algos.compute_policy_loss_bypass_mode(rollout, log_prob, adv, mask, "token-mean", ActorConfig())


def test_kl_shaped_rewards_agree_with_the_trainers_penalty():
    scores = torch.tensor([[0.0, 1.0, 0.0]])
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -1.0, -9.0]])
    rewards, _ = apply_kl_penalty(scores, old, ref, torch.tensor([[1, 1, 0]]), FixedKLController(0.1), "kl")
    # k1 = [0.5, 0, (masked)] -> [0 - 0.1 * 0.5, 1 - 0] on the valid tokens
    torch.testing.assert_close(verl_core_algos.compute_rewards(scores, old, ref, 0.1)[:, :2], rewards[:, :2])
    torch.testing.assert_close(rewards[:, :2], torch.tensor([[-0.05, 1.0]]))


def test_entropy_loss_of_uniform_policy_is_log_vocab():
    logits = torch.zeros(2, 3, 8)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert verl_core_algos.compute_entropy_loss(logits, mask).item() == pytest.approx(math.log(8), rel=1e-6)
