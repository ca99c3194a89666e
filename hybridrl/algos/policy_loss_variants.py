"""Policy losses beyond PPO's clipped ratio, under verl's names and hybridrl/algos/policy_loss.py's contract.

importance_sampling, up, cispo, sapo, dppo_tv, dppo_kl, geo_mean and topr, each with its formula and paper.
Notation: rho_t = pi(y_t) / pi_old(y_t), sg[.] a stop-gradient, eps_low / eps_high the clip_ratio_low /
_high. At rho = 1 each one's per-token gradient is REINFORCE's, -A grad log pi, up to its aggregation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hybridrl.algos.policy_loss import (
    LossConfig,
    _apply_is_weights,
    _clip_bounds,
    _dual_clipped,
    _log_ratio,
    _loss_metrics,
    _weighted_agg,
    register_policy_loss,
)
from hybridrl.utils.torch_functional import masked_mean

Metrics = dict[str, torch.Tensor]


@register_policy_loss("importance_sampling")
def compute_policy_loss_importance_sampling(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: LossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """L = -rho A: the importance-sampled surrogate (Kakade & Langford's CPI objective, PPO without its
    clip). Nothing bounds its gradient, so it suits data near pi_old (one epoch, one mini-batch)."""
    log_ratio = _log_ratio(log_prob, old_log_prob)
    pg_losses = -advantages * torch.exp(log_ratio)
    loss = _weighted_agg(pg_losses, rollout_is_weights, response_mask, loss_agg_mode, config)
    return loss, _loss_metrics(loss, response_mask, -log_ratio)


@register_policy_loss("up")
def compute_policy_loss_up(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: LossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """UP-GRPO, "unbounded positive" (https://arxiv.org/abs/2607.06987, Eq. 15).

    A > 0: -A pi / sg[pi] (REINFORCE's gradient, no pi_old anchor, no upper clip); A <= 0: `vanilla`'s
    dual-clipped loss. pg_clipfrac: share of the A <= 0 tokens clipped.
    """
    low, high = _clip_bounds(config)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    dual_losses, clipped, dual_clipped = _dual_clipped(advantages, torch.exp(log_ratio), low, high,
                                                       config.clip_ratio_c)  # vanilla's, for A <= 0
    positive_branch = -advantages * torch.exp(log_prob - log_prob.detach())
    pg_losses = torch.where(advantages > 0, positive_branch, dual_losses)
    loss = _weighted_agg(pg_losses, rollout_is_weights, response_mask, loss_agg_mode, config)
    metrics = _loss_metrics(loss, response_mask, -log_ratio, clipfrac_lower=dual_clipped)
    with torch.no_grad():  # pg_clipfrac: of the A <= 0 tokens
        metrics["pg_clipfrac"] = masked_mean(clipped.float(), response_mask * (advantages <= 0))
    return loss, metrics


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: LossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax-M1, https://arxiv.org/abs/2506.13585): clip the importance weight, not the update.

    L = -sg[clip(rho, 1 - eps_low, 1 + eps_high)] A log pi: every token keeps its gradient, only its weight
    is bounded. The paper bounds only the top: set clip_ratio_low near 1. pg_clipfrac: share clipped.
    """
    low, high = _clip_bounds(config, "cispo")
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio).detach()  # (batch, response_len)
    weight = torch.clamp(ratio, min=1 - low, max=1 + high)
    pg_losses = -weight * advantages * log_prob
    loss = _weighted_agg(pg_losses, rollout_is_weights, response_mask, loss_agg_mode, config)
    return loss, _loss_metrics(loss, response_mask, -log_ratio, weight != ratio)


@register_policy_loss("sapo", own_aggregation="seq-mean-token-mean")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: LossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Soft Adaptive Policy Optimization (https://arxiv.org/abs/2511.20347): a smooth gate for the hard clip.

    L = -f_tau(rho) A, f_tau(r) = (4 / tau) sigmoid(tau (r - 1)); tau = actor.tau_pos where A > 0, else
    actor.tau_neg (the paper's 1.0 / 1.05). Always "seq-mean-token-mean", as the paper and verl.
    """
    tau_pos, tau_neg = config.tau_pos, config.tau_neg
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"the sapo policy loss needs actor.tau_pos and actor.tau_neg > 0, got {tau_pos}, {tau_neg}")
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)  # (batch, response_len)
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1)) * (4 / tau)
    loss = _weighted_agg(-gate * advantages, rollout_is_weights, response_mask, "seq-mean-token-mean", config)
    return loss, _loss_metrics(loss, response_mask, -log_ratio)


def _dppo_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
               response_mask: torch.Tensor, loss_agg_mode: str, kept: torch.Tensor, config: LossConfig,
               rollout_is_weights: torch.Tensor | None) -> tuple[torch.Tensor, Metrics]:
    """-sg[min(rho, c)] A log pi on the `kept` tokens (batch, response_len), 0 on the others."""
    clip_ratio_c = config.clip_ratio_c
    if clip_ratio_c <= 0:
        raise ValueError(f"DPPO truncates the ratio at clip_ratio_c, which must be > 0, got {clip_ratio_c}")
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio).detach()
    kept = kept.detach().to(log_prob.dtype)
    pg_losses = -advantages * torch.clamp(ratio, max=clip_ratio_c) * log_prob * kept
    loss = _weighted_agg(pg_losses, rollout_is_weights, response_mask, loss_agg_mode, config)
    cut = (ratio > clip_ratio_c).to(kept.dtype) * kept
    return loss, _loss_metrics(loss, response_mask, -log_ratio, 1 - kept, cut)


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: LossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """DPPO with a binary total-variation trust region (https://arxiv.org/abs/2602.04879).

    A token keeps its gradient -sg[min(rho, c)] A grad log pi while p - p_old <= eps_high (A > 0) or
    >= -eps_low (A <= 0): the clip ratios are probability differences here. c = clip_ratio_c (the paper
    advises ~20). pg_clipfrac: share out of the region; pg_clipfrac_lower: share of kept tokens cut at c.
    """
    low, high = _clip_bounds(config, "dppo_tv")
    with torch.no_grad():
        moved = torch.exp(log_prob) - torch.exp(old_log_prob)  # (batch, response_len)
        kept = torch.where(advantages > 0, moved <= high, moved >= -low)
    return _dppo_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, kept, config,
                      rollout_is_weights)


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: LossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """DPPO with a binary-KL trust region (https://arxiv.org/abs/2602.04879).

    As `dppo_tv`, with the divergence KL = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p)):
    a token moved in the advantage's direction by more than eps_high / eps_low of it loses its gradient.
    """
    low, high = _clip_bounds(config, "dppo_kl")
    with torch.no_grad():
        p, p_old = torch.exp(log_prob), torch.exp(old_log_prob)
        binary_kl = p_old * (old_log_prob - log_prob) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        kept = torch.where(advantages > 0, (binary_kl <= high) | (p <= p_old), (binary_kl <= low) | (p >= p_old))
    return _dppo_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, kept, config,
                      rollout_is_weights)


def _sequence_denominator(name: str, rows: int, global_batch_info: Mapping[str, Any] | None) -> float:
    """The mini-batch's sequences per rank, the divisor of a micro-batch's summed per-sequence losses."""
    if not global_batch_info:
        return float(rows)  # a direct call on a whole batch
    size, dp_size = global_batch_info.get("global_batch_size"), global_batch_info.get("dp_size", 1)
    if size is None or float(size) <= 0 or dp_size is None or dp_size < 1:
        raise ValueError(f"{name} requires global_batch_info with global_batch_size > 0 and dp_size >= 1 (the "
                         f"mini-batch's totals); got global_batch_size={size!r}, dp_size={dp_size!r}")
    return float(size) / dp_size


@register_policy_loss("geo_mean", own_aggregation="the mean over sequences of -A_i r_i")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: LossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Geometric-Mean Policy Optimization (GMPO, https://arxiv.org/abs/2507.20673).

    r_i = exp(mean_t l~_it), l~ = sign(A) min(sign(A) l, sign(A) clip(l, -eps_low, eps_high)) the token
    log-ratio clipped on the side its advantage pushes; L_i = -A_i r_i, A_i the sequence's mean advantage.
    The paper uses clip_ratio=0.4. The loss is the mean of L_i over the mini-batch's sequences, whatever
    `loss_agg_mode` says; rollout_is_weights enter as their per-sequence geometric mean.
    pg_clipfrac / pg_clipfrac_lower: shares of tokens clipped with A > 0 / A < 0.
    """
    low, high = _clip_bounds(config, "geo_mean")
    log_ratio = _log_ratio(log_prob, old_log_prob)
    clipped_log_ratio = torch.clamp(log_ratio, min=-low, max=high)
    sign = torch.sign(advantages)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped_log_ratio)  # (batch, response_len)
    seq_ratio = torch.exp(masked_mean(pessimistic, response_mask, axis=-1))  # (batch,)
    seq_advantage = masked_mean(advantages, response_mask, axis=-1)
    seq_losses = -seq_advantage * seq_ratio
    if rollout_is_weights is not None:
        weights = _apply_is_weights(torch.ones_like(log_prob), rollout_is_weights)  # shape-checked, detached
        seq_losses = seq_losses * torch.exp(masked_mean(torch.log(weights + 1e-10), response_mask, axis=-1))
    loss = seq_losses.sum() / _sequence_denominator("geo_mean", log_prob.shape[0], config.global_batch_info)
    clipped = log_ratio != clipped_log_ratio
    return loss, _loss_metrics(loss, response_mask, -log_ratio, clipped & (advantages > 0),
                               clipped & (advantages < 0))


@register_policy_loss("topr", own_aggregation="seq-mean-token-mean")
def compute_policy_loss_topr(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: LossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Tapered Off-Policy REINFORCE (TOPR, https://arxiv.org/abs/2503.14286).

    L_it = -sg[w_i] A_it log pi(y_it): w_i = 1 for a sequence with mean advantage >= 0, else its ratio
    exp(mean_t log rho_it) clipped to [topr_negative_ratio_lower, _upper] (the paper's [0, 1]). Always
    "seq-mean-token-mean". topr_taper_weight_mean: mean w over sequences with valid tokens.
    """
    lower, upper = config.policy_loss.topr_negative_ratio_lower, config.policy_loss.topr_negative_ratio_upper
    if not 0 <= lower <= upper:
        raise ValueError(f"topr needs 0 <= policy_loss.topr_negative_ratio_lower <= topr_negative_ratio_upper, got "
                         f"{lower}, {upper}")
    log_ratio = _log_ratio(log_prob, old_log_prob)
    with torch.no_grad():
        seq_ratio = torch.exp(masked_mean(log_ratio, response_mask, axis=-1))  # (batch,)
        negative = masked_mean(advantages, response_mask, axis=-1) < 0
        tapered = torch.clamp(seq_ratio, min=lower, max=upper)
        weight = torch.where(negative, tapered, torch.ones_like(seq_ratio))
    pg_losses = -advantages * log_prob * weight.unsqueeze(-1)
    loss = _weighted_agg(pg_losses, rollout_is_weights, response_mask, "seq-mean-token-mean", config)
    has_tokens = (response_mask.sum(dim=-1) > 0).to(weight.dtype)
    return loss, {**_loss_metrics(loss, response_mask, -log_ratio),
                  "topr_taper_weight_mean": masked_mean(weight, has_tokens)}
