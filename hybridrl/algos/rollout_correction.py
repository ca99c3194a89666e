"""Rollout correction: reweight or reject where the rollout engine's policy differs from the trainer's.

With x = old_log_prob - rollout_log_prob per token (log pi_train / pi_rollout; inputs (batch,
response_len), metrics plain floats under verl's names):

- IS weights w = exp(x) per token or exp(sum_t x_t) per sequence (Yao et al. 2025, "Your efficient RL
  framework secretly brings you off-policy RL training"), truncated at one threshold u (w = min(w, u))
  or zeroed outside a "lower_upper" range (IcePop); losses take them as `rollout_is_weights`.
- Rejection zeroes the response mask of tokens or sequences whose divergence (k1 = -x, k2 = x^2 / 2,
  k3 = exp(x) - 1 - x) is out of bounds; options token_k*, seq_sum_k*, seq_mean_k*, seq_max_k2/k3, all
  comma-separated ones must pass. k1 keeps log(lower) <= s <= log(upper) (one bound u: lower = 1/u);
  k2 / k3 keep s <= upper.

Bypass mode (`bypass_mode=true`): the rollout's log-probs stand in for pi_old; the weights and the rejection
mask come per micro-batch from the detached current log-probs, and the loss is `ppo_clip` on the tokens
rejection keeps (the clipped ratio is the correction already) or `reinforce`, L = -sg[w] A log pi_theta.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hybridrl.algos.policy_loss import ACTOR_CONFIG, LossConfig, _weighted_agg, get_policy_loss_fn
from hybridrl.utils.torch_functional import masked_mean, masked_sum
from hybridrl.utils.typed_config import require_config_object

# log-ratios clamped before exp() so one wild token cannot overflow a weight
LOG_RATIO_BOUND = 20.0
IS_LEVELS = ("token", "sequence")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


def _parse_bounds(spec: str | float, what: str) -> tuple[float | None, float]:
    """(lower, upper) of "upper" or "lower_upper" (lower None when not given), with 0 < lower <= upper."""
    lower_text, _, upper_text = str(spec).strip().rpartition("_")
    try:
        upper, lower = float(upper_text), (float(lower_text) if lower_text else None)
    except ValueError:
        raise ValueError(f"{what} {spec!r} is not a number or 'lower_upper'") from None
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"{what} {spec!r} needs 0 < lower <= upper")
    return lower, upper


def parse_is_threshold(spec: str | float) -> tuple[float, float | None]:
    """(upper, lower): "2.0" or 2.0 -> (2.0, None) (truncate); "0.5_5.0" -> (5.0, 0.5) (IcePop)."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise TypeError(f"rollout_is_threshold must be a number or a 'lower_upper' string, got {spec!r}")
    lower, upper = _parse_bounds(spec, "rollout_is_threshold")
    return upper, lower


def rs_option_names(rollout_rs: str) -> list[str]:
    """The distinct comma-separated rejection options, each checked against RS_OPTIONS."""
    options = list(dict.fromkeys(o.strip() for o in rollout_rs.split(",") if o.strip()))
    unknown = [o for o in options if o not in RS_OPTIONS]
    if not options or unknown:
        raise ValueError(f"rollout_rs options {unknown or rollout_rs!r} are not among {list(RS_OPTIONS)}")
    return options


def parse_rs_options(rollout_rs: str, threshold: str | float | None) -> dict[str, tuple[float | None, float]]:
    """{option: (lower, upper)} for comma-separated options, one threshold each or one shared by all."""
    options = rs_option_names(rollout_rs)
    if threshold is None:
        raise ValueError("rollout_rs needs rollout_rs_threshold")
    specs = [s.strip() for s in str(threshold).split(",") if s.strip()]
    if len(specs) == 1:
        specs = specs * len(options)
    if len(specs) != len(options):
        raise ValueError(f"rollout_rs_threshold gives {len(specs)} thresholds for {len(options)} options")
    bounds = {}
    for option, spec in zip(options, specs, strict=True):
        what = f"rollout_rs_threshold for {option}"
        lower, upper = _parse_bounds(spec, what)
        if lower is not None and not option.endswith("k1"):
            raise ValueError(f"rollout_rs option {option} takes one upper bound, got {spec!r}")
        if lower is None and option.endswith("k1"):  # a k1 bound is two-sided: 1 / upper below
            lower = 1.0 / upper
            if lower > upper:
                raise ValueError(f"{what} {spec!r} needs 0 < lower <= upper (its lower is 1 / upper = {lower:g})")
        bounds[option] = (lower, upper)
    return bounds


def compute_rollout_correction_weights(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_is: str = "token",
    rollout_is_threshold: str | float = 2.0, rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """IS weights (batch, response_len), 0 on padding and detached, with their metrics."""
    if rollout_is not in IS_LEVELS:
        raise ValueError(f"rollout_is must be one of {IS_LEVELS}, got {rollout_is!r}")
    upper, lower = parse_is_threshold(rollout_is_threshold)
    mask = response_mask.to(log_ratio.dtype)
    if rollout_is == "token":
        raw = torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)) * mask
    else:
        seq_log_ratio = masked_sum(log_ratio, response_mask, axis=-1).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        raw = torch.exp(seq_log_ratio).unsqueeze(-1) * mask  # (batch, response_len)
    outside = (raw > upper) | ((raw < lower) if lower is not None else torch.zeros_like(raw, dtype=torch.bool))
    weights = raw.clamp(max=upper) if lower is None else torch.where(outside, torch.zeros_like(raw), raw)
    valid = response_mask.bool()
    mean = masked_mean(weights, response_mask)
    metrics = {
        "rollout_is_mean": mean.item(),
        "rollout_is_max": weights[valid].max().item(),
        "rollout_is_min": weights[valid].min().item(),
        "rollout_is_ratio_fraction_high": masked_mean((raw > upper).float(), response_mask).item(),
        "rollout_is_ratio_fraction_low": masked_mean((raw < (lower or 1.0 / upper)).float(), response_mask).item(),
        # Kish effective sample size as a share of the tokens: (mean w)^2 / mean(w^2)
        "rollout_is_eff_sample_size": (mean**2 / masked_mean(weights**2, response_mask).clamp(min=1e-12)).item(),
    }
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = masked_mean(outside.float(), response_mask).item()
    if rollout_is_batch_normalize:
        if mean > 1e-8:
            weights = weights / mean
        metrics["rollout_is_batch_norm_factor"] = mean.item()
    return weights.detach(), metrics


def _rs_statistic(option: str, log_ratio: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The option's divergence, per token (batch, response_len) or per sequence (batch, 1)."""
    x = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    per_token = {"k1": -x, "k2": 0.5 * x**2, "k3": torch.exp(x) - 1 - x}[option[-2:]]
    level = option.rsplit("_", 1)[0]
    if level == "token":
        return per_token
    if level == "seq_sum":
        return masked_sum(per_token, response_mask, axis=-1).unsqueeze(-1)
    if level == "seq_mean":
        return masked_mean(per_token, response_mask, axis=-1).unsqueeze(-1)
    masked = per_token.masked_fill(~response_mask.bool(), -torch.inf)
    return masked.max(dim=-1, keepdim=True).values.clamp(min=0.0)  # seq_max; an empty row gives 0


def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_rs: str = "token_k1",
    rollout_rs_threshold: str | float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """response_mask with rejected tokens (or whole sequences) set to 0, and per-option metrics."""
    keep = torch.ones_like(response_mask, dtype=torch.bool)
    metrics: dict[str, float] = {}
    for option, (lower, upper) in parse_rs_options(rollout_rs, rollout_rs_threshold).items():
        stat = _rs_statistic(option, log_ratio, response_mask).expand_as(log_ratio)
        if option.endswith("k1"):
            passes = (stat >= math.log(lower)) & (stat <= math.log(upper))
        else:
            passes = stat <= upper
        keep &= passes
        valid_stats = stat[response_mask.bool()]
        metrics[f"rollout_rs_{option}_mean"] = masked_mean(stat, response_mask).item()
        metrics[f"rollout_rs_{option}_max"] = valid_stats.max().item()
        metrics[f"rollout_rs_{option}_min"] = valid_stats.min().item()
        metrics[f"rollout_rs_{option}_masked_fraction"] = masked_mean((~passes).float(), response_mask).item()
    metrics["rollout_rs_masked_fraction"] = masked_mean((~keep).float(), response_mask).item()
    return response_mask * keep.to(response_mask.dtype), metrics


def compute_offpolicy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor | None, response_mask: torch.Tensor
) -> dict[str, float]:
    """How far the rollout policy is from the trainer's: KL estimates and perplexities."""
    train_nll = -masked_mean(old_log_prob, response_mask, axis=-1)  # (batch,) per-sequence mean NLL
    metrics = {"training_ppl": torch.exp(train_nll).mean().item(), "training_log_ppl": train_nll.mean().item()}
    if rollout_log_prob is None:
        return metrics
    x = (old_log_prob - rollout_log_prob).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    rollout_nll = -masked_mean(rollout_log_prob, response_mask, axis=-1)
    metrics.update({
        "kl": masked_mean(-x, response_mask).item(),  # k1 estimate of KL(rollout || train)
        "k3_kl": masked_mean(torch.exp(x) - 1 - x, response_mask).item(),
        "rollout_ppl": torch.exp(rollout_nll).mean().item(),
        "rollout_log_ppl": rollout_nll.mean().item(),
        "log_ppl_diff": (train_nll - rollout_nll).mean().item(),
        "chi2_token": (masked_mean(torch.exp(2 * x), response_mask) - 1).item(),
    })
    return metrics


def compute_rollout_correction(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
    rollout_is: str | None = None, rollout_is_threshold: str | float | None = 2.0,
    rollout_is_batch_normalize: bool = False, rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """(IS weights (batch, response_len) or None without rollout_is, the mask after rejection, metrics
    under `rollout_corr/`). verl's DataProto form: `compute_rollout_correction_and_rejection_mask` in
    compat/verl_core_algos.py."""
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(f"shapes differ: old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob "
                         f"{tuple(rollout_log_prob.shape)}, response_mask {tuple(response_mask.shape)}")
    if not response_mask.any():
        raise ValueError("rollout correction needs at least one valid response token")
    log_ratio = old_log_prob - rollout_log_prob  # (batch, response_len) log pi_train / pi_rollout
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        weights, is_metrics = compute_rollout_correction_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize)
        metrics.update(is_metrics)
    mask = response_mask.clone()
    if rollout_rs is not None:
        mask, rs_metrics = compute_rollout_rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_metrics)
    metrics.update(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, mask, {f"rollout_corr/{name}": value for name, value in metrics.items()}

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
    loss = _weighted_agg(-advantages * log_prob, rollout_is_weights, response_mask, loss_agg_mode, config)
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
    # ppo_clip reports the weights but leaves them out: its ratio pi_theta / pi_rollout is the correction already
    if correction.loss_type == "reinforce":
        is_weights = None if weights is None else weights.to(log_prob.dtype)
        loss, pg_metrics = compute_policy_loss_reinforce(rollout_log_prob, log_prob, advantages, kept_mask,
                                                         loss_agg_mode, config, is_weights)
    else:
        loss, pg_metrics = get_policy_loss_fn(config.policy_loss.loss_mode)(
            rollout_log_prob, log_prob, advantages, kept_mask, loss_agg_mode, config)
    return loss, {**pg_metrics, **metrics}
