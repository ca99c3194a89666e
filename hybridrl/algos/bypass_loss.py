"""Rollout-correction bypass mode's policy loss (`algorithm.rollout_correction.bypass_mode=true`).

The rollout's log-probs stand in for pi_old; the weights w = pi_theta / pi_rollout and the rejection mask
are computed per micro-batch from the detached current log-probs, as decoupled mode computes them
(hybridrl/algos/rollout_correction.py). The loss is `ppo_clip`, the actor's policy loss on the tokens
rejection keeps (no IS weights: the clipped ratio is the correction already), or `reinforce`,
L = -sg[w] A log pi_theta on those tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from hybridrl.algos.aggregate import agg_loss
from hybridrl.algos.policy_loss import ACTOR_CONFIG, LossConfig, _apply_is_weights, get_policy_loss_fn
from hybridrl.algos.rollout_correction import compute_rollout_correction
from hybridrl.utils.torch_functional import masked_mean
from hybridrl.utils.typed_config import require_config_object

BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: LossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """REINFORCE with optional importance weights (verl's name and call): L = -sg[w] A log pi, w = 1 without
    them. `rollout_log_prob` serves only the `ppo_kl` metric; `config` is the actor config (its
    `global_batch_info`)."""
    require_config_object(config, "compute_policy_loss_reinforce", ACTOR_CONFIG)
    pg_losses = _apply_is_weights(-advantages * log_prob, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **config.global_batch_info)
    with torch.no_grad():
        metrics = {"ppo_kl": masked_mean(rollout_log_prob - log_prob, response_mask)}
    return loss, metrics


def compute_policy_loss_bypass_mode(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: LossConfig,
    correction: Any,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Bypass mode's loss; returns (loss, metrics), this micro-batch's `rollout_corr/*` among them.

    `config`: the actor config; ppo_clip runs its `policy_loss.loss_mode`. `correction`:
    algorithm.rollout_correction (RolloutCorrectionConfig in hybridrl/trainer/ppo_config.py): its loss_type
    and rollout_is* / rollout_rs* options.
    """
    require_config_object(config, "bypass mode's loss", ACTOR_CONFIG)
    if correction.loss_type not in BYPASS_LOSS_TYPES:
        raise ValueError(f"algorithm.rollout_correction.loss_type must be one of {BYPASS_LOSS_TYPES}, "
                         f"got {correction.loss_type!r}")
    with torch.no_grad():
        weights, kept_mask, metrics = compute_rollout_correction(
            log_prob.detach().float(), rollout_log_prob.float(), response_mask, rollout_is=correction.rollout_is,
            rollout_is_threshold=correction.rollout_is_threshold,
            rollout_is_batch_normalize=correction.rollout_is_batch_normalize, rollout_rs=correction.rollout_rs,
            rollout_rs_threshold=correction.rollout_rs_threshold)
    kept_mask = kept_mask.to(response_mask.dtype)
    # ppo_clip reports the weights but leaves them out: its ratio pi_theta / pi_rollout is the correction already
    if correction.loss_type == "reinforce":
        is_weights = None if weights is None else weights.to(log_prob.dtype)
        loss, pg_metrics = compute_policy_loss_reinforce(rollout_log_prob, log_prob, advantages, kept_mask,
                                                         loss_agg_mode, config, is_weights)
    else:
        loss, pg_metrics = get_policy_loss_fn(config.policy_loss.loss_mode)(
            rollout_log_prob, log_prob, advantages, kept_mask, loss_agg_mode, config)
    return loss, {**pg_metrics, **metrics}
