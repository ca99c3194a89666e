"""Bypass mode's loss: rollout correction computed inside the loss from the current policy."""

import dataclasses
import math

import pytest
import torch

from hybridrl.algos import compute_policy_loss_vanilla
from hybridrl.algos.rollout_correction import compute_policy_loss_bypass_mode, compute_policy_loss_reinforce
from hybridrl.trainer.ppo_config import RolloutCorrectionConfig
from hybridrl.workers.config import ActorConfig

ROLLOUT = torch.tensor([[-1.0, -0.5, -2.0]])
MASK = torch.ones(1, 3)
ADV = torch.tensor([[1.0, -2.0, 0.5]])
ACTOR = ActorConfig(clip_ratio=0.2)


def current(log_ratios):
    return (ROLLOUT + torch.tensor([log_ratios])).requires_grad_(True)


def bypass(**options) -> RolloutCorrectionConfig:
    return RolloutCorrectionConfig(bypass_mode=True, **options)


def test_reinforce_weights_each_token_by_its_truncated_ratio():
    log_prob = current([math.log(3.0), math.log(0.5), 0.0])  # ratios 3 (truncated to 2), 0.5, 1
    loss, metrics = compute_policy_loss_bypass_mode(
        ROLLOUT, log_prob, ADV, MASK, "token-mean", ACTOR,
        bypass(loss_type="reinforce", rollout_is="token", rollout_is_threshold=2.0))
    grad = torch.autograd.grad(loss, log_prob)[0]
    torch.testing.assert_close(grad, -ADV * torch.tensor([[2.0, 0.5, 1.0]]) / 3)  # -sg[w] A grad log pi
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx((2.0 + 0.5 + 1.0) / 3)
    assert metrics["ppo_kl"].item() == pytest.approx(-(math.log(3.0) + math.log(0.5)) / 3)


def test_reinforce_without_weights_is_plain_policy_gradient():
    log_prob = current([0.3, -0.2, 0.1])
    loss, _ = compute_policy_loss_reinforce(ROLLOUT, log_prob, ADV, MASK, "token-mean", ACTOR)
    assert loss.item() == pytest.approx(float(-(ADV * log_prob.detach()).mean()))
    # the batch totals come on the config, where the actor puts them per mini-batch
    halved, _ = compute_policy_loss_reinforce(
        ROLLOUT, log_prob, ADV, MASK, "token-mean",
        dataclasses.replace(ACTOR, global_batch_info={"batch_num_tokens": 6.0}))
    assert halved.item() == pytest.approx(loss.item() / 2)


def test_ppo_clip_is_the_actors_loss_on_the_tokens_rejection_keeps():
    log_prob = current([0.05, math.log(4.0), -0.1])  # the middle token's k1 divergence is far out
    loss, metrics = compute_policy_loss_bypass_mode(ROLLOUT, log_prob, ADV, MASK, "token-mean", ACTOR,
                                                    bypass(rollout_rs="token_k1", rollout_rs_threshold=2.0))
    kept = torch.tensor([[1.0, 0.0, 1.0]])
    expected, _ = compute_policy_loss_vanilla(ROLLOUT, log_prob, ADV, kept, config=ACTOR)
    torch.testing.assert_close(loss, expected)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 3)
    assert "pg_clipfrac" in metrics and "rollout_corr/kl" in metrics
    # with rollout_is set, ppo_clip reports the IS weights but leaves the loss as it was (as verl)
    weighted, weighted_metrics = compute_policy_loss_bypass_mode(
        ROLLOUT, log_prob, ADV, MASK, "token-mean", ACTOR,
        bypass(rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold=2.0))
    torch.testing.assert_close(weighted, expected)
    assert "rollout_corr/rollout_is_mean" in weighted_metrics
