"""Policy-gradient losses, registered by name (`actor_rollout_ref.actor.policy_loss.loss_mode`).

Every loss has the signature

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
       config=None, rollout_is_weights=None, **settings) -> (loss, metrics)

with tensors of shape (batch, response_len), `loss` a scalar to minimise, and `metrics` a dict of
detached scalar tensors (`pg_clipfrac`, `ppo_kl`, `pg_clipfrac_lower`, ...). `settings` are plain
keywords from the actor config (clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c,
clip_cov_ratio, ...); `config` is verl's way of passing the same settings (an actor config object).
`global_batch_info` carries the mini-batch totals (`agg_loss`'s batch_num_tokens, global_batch_size,
dp_size) so that micro-batch losses add up to the mini-batch loss. `rollout_is_weights`
(batch, response_len) multiplies each token's loss before aggregation (rollout correction).

A loss declares the settings it reads as keyword-only parameters; their defaults are the actor
config's (hybridrl/workers/config.py; tests/algos/test_policy_loss.py holds them equal), so a loss
called without a setting behaves as a run that leaves the key unset. `register_policy_loss` wraps it so
that every call -- direct or through `compute_pg_loss` -- accepts one settings dict for all losses
(each loss is handed only what it declares), rejects a setting no loss declares (a misspelling would
otherwise be ignored), and rejects `rollout_is_weights` for a loss that cannot apply them.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch

from hybridrl.algos.aggregate import agg_loss
from hybridrl.algos.config_args import merge_config_settings
from hybridrl.utils.registry import Registry
from hybridrl.utils.torch_functional import masked_mean

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
POLICY_LOSS_REGISTRY: Registry[PolicyLossFn] = Registry("policy loss")
# losses whose objective fixes how tokens are averaged, whatever loss_agg_mode says
_OWN_AGGREGATION: dict[str, str] = {}


class LossMetrics(dict):
    """A policy loss's metrics by name (`pg_clipfrac`, `ppo_kl`, ...; the actor logs them under `actor/`).
    verl's losses key the same values `actor/<name>`; looking one up that way finds it here too."""

    def __missing__(self, key: object) -> torch.Tensor:
        if isinstance(key, str) and key.startswith("actor/") and key.removeprefix("actor/") in self:
            return self[key.removeprefix("actor/")]
        raise KeyError(key)


def register_policy_loss(name: str, *, override: bool = False,
                         own_aggregation: str | None = None) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering a policy loss under `name` (verl's `register_policy_loss`).

    It returns the loss wrapped for the uniform call described in the module docstring; the wrapper is
    what is registered and what the decorated name is bound to. `own_aggregation` declares that the loss
    averages its tokens one fixed way and ignores `loss_agg_mode` (the trainer says so when they differ).
    """

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        wrapped = _uniform_call(name, fn)
        POLICY_LOSS_REGISTRY.add(name, wrapped, override=override)
        if own_aggregation is None:
            _OWN_AGGREGATION.pop(name, None)
        else:
            _OWN_AGGREGATION[name] = own_aggregation
        return wrapped

    return decorator


def own_aggregation(name: str) -> str | None:
    """How a registered loss averages its tokens when that ignores `loss_agg_mode`; None when it follows it."""
    return _OWN_AGGREGATION.get(name)


def _uniform_call(name: str, fn: PolicyLossFn) -> PolicyLossFn:
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    declared = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}

    @functools.wraps(fn)
    def call(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
             rollout_is_weights=None, **settings):
        if config is not None:
            settings = merge_config_settings(config, settings, f"policy loss {name!r}")
        unknown = sorted(set(settings) - known_policy_loss_settings())
        if unknown:
            raise ValueError(
                f"unknown policy loss setting(s) {unknown}; settings declared by the registered losses: "
                f"{sorted(known_policy_loss_settings())}"
            )
        if rollout_is_weights is not None:
            if not applies_rollout_is_weights(fn):  # **settings would swallow the weights unused
                raise ValueError(f"policy loss {name!r} does not apply rollout_is_weights; it cannot correct "
                                 f"for the rollout policy")
            settings["rollout_is_weights"] = rollout_is_weights
        if not takes_any:
            settings = {key: value for key, value in settings.items() if key in declared}
        loss, metrics = fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, **settings)
        return loss, LossMetrics(metrics)

    return call


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The registered loss; an unknown name raises a KeyError listing the registered ones."""
    return POLICY_LOSS_REGISTRY.get(name)


def applies_rollout_is_weights(loss: PolicyLossFn) -> bool:
    """Whether a registered loss multiplies its tokens by `rollout_is_weights` (others refuse them)."""
    return "rollout_is_weights" in inspect.signature(loss).parameters


def known_policy_loss_settings() -> set[str]:
    """Keyword-only settings declared by any registered policy loss (clip_ratio, kl_cov_ratio, ...)."""
    names: set[str] = set()
    for loss_name in POLICY_LOSS_REGISTRY:
        # inspect follows the wrapper's __wrapped__ to the loss's own parameters
        for param in inspect.signature(POLICY_LOSS_REGISTRY.get(loss_name)).parameters.values():
            if param.kind is inspect.Parameter.KEYWORD_ONLY:
                names.add(param.name)
    return names


def _apply_is_weights(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """Per-token losses times the rollout importance weights (batch, response_len), when given."""
    if rollout_is_weights is None:
        return pg_losses
    if rollout_is_weights.shape != pg_losses.shape:
        raise ValueError(f"rollout_is_weights has shape {tuple(rollout_is_weights.shape)}; the per-token "
                         f"losses have {tuple(pg_losses.shape)}")
    return pg_losses * rollout_is_weights.detach()  # weights change the sampling measure, not the objective


def _clip_bounds(
    clip_ratio: float, clip_ratio_low: float | None, clip_ratio_high: float | None
) -> tuple[float, float]:
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    if low < 0 or high < 0 or low >= 1:
        raise ValueError(
            f"clip ratios must satisfy 0 <= clip_ratio_low < 1 and clip_ratio_high >= 0, got low={low}, high={high}"
        )
    return low, high


class DualClipped(NamedTuple):
    """PPO's per-token loss with the dual clip (`per_token`), and the terms its metrics compare."""

    per_token: torch.Tensor
    unclipped: torch.Tensor  # -A rho
    clipped: torch.Tensor  # -A clip(rho, 1 - eps_low, 1 + eps_high)
    ppo: torch.Tensor  # max of the two
    dual: torch.Tensor  # -A c, the dual clip's bound for A < 0


def _dual_clipped(advantages: torch.Tensor, ratio: torch.Tensor, low: float, high: float,
                  clip_ratio_c: float) -> DualClipped:
    """max(-A rho, -A clip(rho, 1 - low, 1 + high)), and for A < 0 at most -A c (Ye et al. 2020)."""
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip bound) must be > 1.0, got {clip_ratio_c}")
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    ppo = torch.maximum(unclipped, clipped)
    dual = -advantages * clip_ratio_c
    return DualClipped(torch.where(advantages < 0, torch.minimum(ppo, dual), ppo), unclipped, clipped, ppo, dual)


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=like.dtype, device=like.device)


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    global_batch_info: Mapping[str, Any] | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017, https://arxiv.org/abs/1707.06347) with
    asymmetric clipping (DAPO clip-higher, https://arxiv.org/abs/2503.14476) and dual clip
    (Ye et al. 2020, https://arxiv.org/abs/1912.09729).

    rho = exp(logp - old_logp);  L = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high)), and for
    A < 0 additionally L = min(L, -A c) so a huge ratio on a bad action cannot blow the loss up.
    Metrics: pg_clipfrac (share of tokens where the clipped term is active), pg_clipfrac_lower
    (share where the dual clip is active), ppo_kl = mean(old_logp - logp).
    """
    low, high = _clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # exp() stays finite
    terms = _dual_clipped(advantages, torch.exp(log_ratio), low, high, clip_ratio_c)  # (batch, response_len)
    pg_losses = _apply_is_weights(terms.per_token, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **(global_batch_info or {}))
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((terms.clipped > terms.unclipped).float(), response_mask),
            "pg_clipfrac_lower": masked_mean(((terms.ppo > terms.dual) & (advantages < 0)).float(), response_mask),
            "ppo_kl": masked_mean(-log_ratio, response_mask),
        }
    return loss, metrics


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """verl's older entry point to the PPO loss, kept for recipes that call it: `compute_policy_loss_vanilla`
    with the clip range as `cliprange*` and the metrics returned as (pg_loss, pg_clipfrac, ppo_kl,
    pg_clipfrac_lower). Deprecated in verl and here: call `compute_policy_loss_vanilla`."""
    warnings.warn("compute_policy_loss is deprecated: use compute_policy_loss_vanilla (clip_ratio=..., returns "
                  "(loss, metrics))", DeprecationWarning, stacklevel=2)
    clip_ratio = next((c for c in (cliprange, cliprange_low, cliprange_high) if c is not None), None)
    if clip_ratio is None:
        raise ValueError("compute_policy_loss needs cliprange (or cliprange_low / cliprange_high)")
    loss, metrics = compute_policy_loss_vanilla(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, clip_ratio=clip_ratio,
        clip_ratio_low=cliprange_low, clip_ratio_high=cliprange_high, clip_ratio_c=clip_ratio_c)
    return loss, metrics["pg_clipfrac"], metrics["ppo_kl"], metrics["pg_clipfrac_lower"]


@register_policy_loss("gspo", own_aggregation="seq-mean-token-mean")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    global_batch_info: Mapping[str, Any] | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Group Sequence Policy Optimization (Zheng et al. 2025, https://arxiv.org/abs/2507.18071).

    The ratio is per sequence: s_i = exp((1/|y_i|) sum_t (logp_it - old_logp_it)), clipped to
    [1 - eps_low, 1 + eps_high]. Each token carries s_i through the stop-gradient form
    s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)], whose gradient is the paper's. The paper's objective is
    a mean over sequences of per-sequence means, so aggregation is always "seq-mean-token-mean"
    whatever `loss_agg_mode` says (as in verl). GSPO's clip ranges are typically ~3e-4 / 4e-4.
    """
    low, high = _clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob  # (batch, response_len)
    seq_log_ratio = (log_ratio * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)  # (batch,)
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=10.0))  # (batch, response_len)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    pg_losses = torch.maximum(unclipped, clipped)
    pg_losses = _apply_is_weights(pg_losses, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean", **(global_batch_info or {}))
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((clipped > unclipped).float(), response_mask),
            "pg_clipfrac_lower": _zero(loss),
            "ppo_kl": masked_mean(-log_ratio, response_mask),
        }
    return loss, metrics


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    global_batch_info: Mapping[str, Any] | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Group Policy Gradient (Chu et al. 2025, https://arxiv.org/abs/2504.02546): plain REINFORCE
    with no ratio and no clipping, L = -A * logp. Pair it with the `gpg` advantage estimator."""
    pg_losses = _apply_is_weights(-log_prob * advantages, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **(global_batch_info or {}))
    with torch.no_grad():
        metrics = {"pg_clipfrac": _zero(loss), "pg_clipfrac_lower": _zero(loss), "ppo_kl": _zero(loss)}
    return loss, metrics


@torch.no_grad()
def _token_covariance(advantages: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token centred product (A - mean A)(logp - mean logp) over valid tokens, (batch, response_len).

    Its batch mean is Cov(A, logp), the quantity Cui et al. show drives entropy collapse."""
    return (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob, mask))


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
    global_batch_info: Mapping[str, Any] | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-Cov (Cui et al. 2025, The Entropy Mechanism of RL for Reasoning LMs,
    https://arxiv.org/abs/2505.22617).

    PPO clipping as in `vanilla` (without dual clip), plus: among valid, not-already-clipped tokens
    whose covariance term (A - mean A)(logp - mean logp) lies in (clip_cov_lb, clip_cov_ub),
    max(1, int(clip_cov_ratio * n_tokens)) are picked at random and their loss (and gradient) set to 0,
    which keeps high-covariance tokens from collapsing the policy's entropy.
    pg_clipfrac reports the share of tokens removed that way.
    """
    if clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {clip_cov_ratio}")
    low, high = _clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    valid = response_mask != 0
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)  # (batch, response_len)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    with torch.no_grad():
        cov = _token_covariance(advantages, log_prob, response_mask)
        eligible = valid & ~(clipped > unclipped) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        candidates = torch.nonzero(eligible.reshape(-1)).squeeze(-1)  # flat positions
        n_pick = min(max(int(clip_cov_ratio * int(valid.sum())), 1), candidates.numel())
        # drawn on the CPU (where `generator` lives), then moved: the same picks for a seed on any device
        order = torch.randperm(candidates.numel(), generator=generator, device="cpu")[:n_pick]
        order = order.to(candidates.device)
        keep = torch.ones(valid.numel(), dtype=log_prob.dtype, device=log_prob.device)
        keep[candidates[order]] = 0
        keep = keep.reshape(valid.shape)  # (batch, response_len) 0 on dropped tokens
    pg_losses = torch.maximum(unclipped, clipped) * keep
    pg_losses = _apply_is_weights(pg_losses, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **(global_batch_info or {}))
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((keep == 0).float(), response_mask),
            "pg_clipfrac_lower": _zero(loss),
            "ppo_kl": masked_mean(-log_ratio, response_mask),
        }
    return loss, metrics


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
    global_batch_info: Mapping[str, Any] | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-Cov (Cui et al. 2025, https://arxiv.org/abs/2505.22617).

    Unclipped surrogate -A * rho on every token, except the top max(1, int(kl_cov_ratio * n_tokens))
    valid tokens by covariance (A - mean A)(logp - mean logp), which get a KL penalty:
    -A * rho + ppo_kl_coef * |logp - old_logp|. ppo_kl reports mean |logp - old_logp| (as verl).
    """
    if kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    valid = response_mask != 0
    log_ratio = log_prob - old_log_prob
    abs_kl = log_ratio.abs()
    ratio = torch.exp(log_ratio)  # (batch, response_len)
    plain = -advantages * ratio
    with torch.no_grad():
        cov = _token_covariance(advantages, log_prob, response_mask).masked_fill(~valid, -torch.inf)
        n_valid = int(valid.sum())
        n_pick = max(1, int(n_valid * kl_cov_ratio)) if n_valid > 0 else 0
        picked = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
        picked[torch.topk(cov.reshape(-1), n_pick).indices] = True
        picked = picked.reshape(valid.shape)  # (batch, response_len)
    pg_losses = torch.where(picked, plain + ppo_kl_coef * abs_kl, plain)
    pg_losses = _apply_is_weights(pg_losses, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **(global_batch_info or {}))
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": _zero(loss),
            "pg_clipfrac_lower": _zero(loss),
            "ppo_kl": masked_mean(abs_kl, response_mask),
        }
    return loss, metrics


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    dro_beta: float | None = None,
    global_batch_info: Mapping[str, Any] | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Direct Reward Optimization (Richemond et al. 2024, https://arxiv.org/abs/2405.19107) as a
    policy loss: L = -(A * logp - beta/2 * (logp - old_logp)^2).

    No ratio and no clipping: the quadratic penalty on the log-ratio keeps the policy near the one
    that sampled the data, with strength `dro_beta` (actor.policy_loss.dro_beta), which must be > 0.
    """
    if dro_beta is None or dro_beta <= 0:
        raise ValueError(f"the dro policy loss needs actor.policy_loss.dro_beta > 0, got {dro_beta}")
    log_ratio = log_prob - old_log_prob  # (batch, response_len)
    pg_losses = -(log_prob * advantages - 0.5 * dro_beta * log_ratio.square())
    pg_losses = _apply_is_weights(pg_losses, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **(global_batch_info or {}))
    with torch.no_grad():
        metrics = {"pg_clipfrac": _zero(loss), "pg_clipfrac_lower": _zero(loss),
                   "ppo_kl": masked_mean(-log_ratio, response_mask)}
    return loss, metrics


def compute_pg_loss(
    loss_mode: str,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    **settings: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Look up `loss_mode` and call it: the single path the actor uses for every policy loss.

    `settings` may hold every loss's settings (and `config=` / `rollout_is_weights=`); the registered
    wrapper hands the loss what it declares and rejects keys that no registered loss declares.
    """
    return get_policy_loss_fn(loss_mode)(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                                         **settings)
