"""Rollout-correction bypass mode's policy loss (`algorithm.rollout_correction.bypass_mode=true`).

The rollout's log-probs stand in for pi_old; the weights w = pi_theta / pi_rollout and the rejection mask
are computed per micro-batch from the detached current log-probs, as decoupled mode computes them
(hybridrl/algos/rollout_correction.py). The loss is `ppo_clip`, the actor's policy loss on the tokens
rejection keeps (no IS weights: the clipped ratio is the correction already), or `reinforce`,
L = -sg[w] A log pi_theta on those tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hybridrl.algos.aggregate import agg_loss
from hybridrl.algos.config_args import policy_loss_settings
from hybridrl.algos.policy_loss import _apply_is_weights, compute_pg_loss
from hybridrl.algos.rollout_correction import compute_rollout_correction
from hybridrl.utils.torch_functional import masked_mean

BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """REINFORCE with optional importance weights (verl's name): L = -sg[w] A log pi, w = 1 without them.

    `rollout_log_prob` serves only the `ppo_kl` metric; `config` may carry `global_batch_info` (verl's way).
    """
    if config is not None and global_batch_info is None:
        global_batch_info = policy_loss_settings(config).get("global_batch_info")
    pg_losses = _apply_is_weights(-advantages * log_prob, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **dict(global_batch_info or {}))
    with torch.no_grad():
        metrics = {"ppo_kl": masked_mean(rollout_log_prob - log_prob, response_mask)}
    return loss, metrics


def compute_policy_loss_bypass_mode(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    *,
    loss_type: str = "ppo_clip",
    loss_mode: str = "vanilla",
    rollout_is: str | None = None,
    rollout_is_threshold: str | float | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
    global_batch_info: Mapping[str, Any] | None = None,
    **loss_settings: Any,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Bypass mode's loss; returns (loss, metrics), this micro-batch's `rollout_corr/*` among them.

    `loss_mode` / `loss_settings`: the actor's policy loss for `ppo_clip`; the rollout_* options are
    algorithm.rollout_correction's. verl passes them on `config` (under `policy_loss.rollout_correction`),
    whose options replace the keywords of the same names: pass them one way, not both.
    """
    if config is not None:
        options = _verl_rollout_correction(config)
        loss_type, rollout_is = options.get("loss_type", loss_type), options.get("rollout_is", rollout_is)
        rollout_is_threshold = options.get("rollout_is_threshold", rollout_is_threshold)
        rollout_is_batch_normalize = options.get("rollout_is_batch_normalize", rollout_is_batch_normalize)
        rollout_rs = options.get("rollout_rs", rollout_rs)
        rollout_rs_threshold = options.get("rollout_rs_threshold", rollout_rs_threshold)
        loss_settings = {**loss_settings, "config": config}
        if global_batch_info is None:
            global_batch_info = policy_loss_settings(config).get("global_batch_info")
    if loss_type not in BYPASS_LOSS_TYPES:
        raise ValueError(f"algorithm.rollout_correction.loss_type must be one of {BYPASS_LOSS_TYPES}, "
                         f"got {loss_type!r}")
    if rollout_is is not None and loss_type != "reinforce":
        raise ValueError("algorithm.rollout_correction.rollout_is in bypass mode needs loss_type=reinforce: "
                         "with ppo_clip the clipped ratio pi_theta / pi_rollout is the correction already")
    with torch.no_grad():
        weights, kept_mask, metrics = compute_rollout_correction(
            log_prob.detach().float(), rollout_log_prob.float(), response_mask, rollout_is=rollout_is,
            rollout_is_threshold=rollout_is_threshold, rollout_is_batch_normalize=rollout_is_batch_normalize,
            rollout_rs=rollout_rs, rollout_rs_threshold=rollout_rs_threshold)
    kept_mask = kept_mask.to(response_mask.dtype)
    if loss_type == "reinforce":
        is_weights = None if weights is None else weights.to(log_prob.dtype)
        loss, pg_metrics = compute_policy_loss_reinforce(rollout_log_prob, log_prob, advantages, kept_mask,
                                                         loss_agg_mode, rollout_is_weights=is_weights,
                                                         global_batch_info=global_batch_info)
    else:
        loss, pg_metrics = compute_pg_loss(loss_mode, rollout_log_prob, log_prob, advantages, kept_mask,
                                           loss_agg_mode, global_batch_info=global_batch_info, **loss_settings)
    return loss, {**pg_metrics, **metrics}


def _verl_rollout_correction(config: Any) -> dict[str, Any]:
    """verl's `config.policy_loss.rollout_correction` as a dict; an error naming it when absent."""
    policy_loss = config.get("policy_loss") if isinstance(config, Mapping) else getattr(config, "policy_loss", None)
    options = None
    if policy_loss is not None:
        options = (policy_loss.get("rollout_correction") if isinstance(policy_loss, Mapping)
                   else getattr(policy_loss, "rollout_correction", None))
    if options is None:
        raise ValueError("bypass mode's loss called with a config needs config.policy_loss.rollout_correction "
                         "(loss_type, rollout_is, rollout_rs, ...), as verl's trainer sets it")
    return dict(options) if isinstance(options, Mapping) else dict(vars(options))
