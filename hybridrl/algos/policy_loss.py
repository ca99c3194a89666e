"""Policy-gradient losses, registered by name (`actor_rollout_ref.actor.policy_loss.loss_mode`).

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config,
       rollout_is_weights=None) -> (loss, metrics)

verl's call: tensors are (batch, response_len); `config` is the actor config (hybridrl/workers/config.py's
ActorConfig, or any object with verl's ActorConfig attributes): a loss reads `config.clip_ratio`,
`config.policy_loss.kl_cov_ratio`, ... and `config.global_batch_info`, the mini-batch totals `agg_loss`
normalises by. `rollout_is_weights` multiplies each token's loss; `metrics` are detached scalars
(`pg_clipfrac`, `ppo_kl`, `pg_clipfrac_lower`, ...).

The critic's clipped value loss, `compute_value_loss`, is here too: it aggregates the same way.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch

from hybridrl.algos.aggregate import agg_loss
from hybridrl.utils.registry import Registry
from hybridrl.utils.torch_functional import clip_by_value, masked_mean
from hybridrl.utils.typed_config import require_config_object

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
POLICY_LOSS_REGISTRY: Registry[PolicyLossFn] = Registry("policy loss")
# losses whose objective fixes how tokens are averaged, whatever loss_agg_mode says
_OWN_AGGREGATION: dict[str, str | None] = {}
ACTOR_CONFIG = "the actor config (hybridrl.workers.config.ActorConfig, or an object with its attributes)"


class LossConfig(Protocol):
    """What the built-in losses read from `config` (verl's ActorConfig names)."""

    clip_ratio: float
    clip_ratio_low: float | None
    clip_ratio_high: float | None
    clip_ratio_c: float
    tau_pos: float
    tau_neg: float
    policy_loss: Any  # actor.policy_loss: clip_cov_*, kl_cov_ratio, ppo_kl_coef, dro_beta, topr_*
    global_batch_info: Mapping[str, Any]


class LossMetrics(dict):
    """A loss's metrics by name (`ppo_kl`); verl's key `actor/ppo_kl` finds them too."""

    def __missing__(self, key: object) -> torch.Tensor:
        if isinstance(key, str) and key.startswith("actor/") and key.removeprefix("actor/") in self:
            return self[key.removeprefix("actor/")]
        raise KeyError(key)


def register_policy_loss(name: str, *, override: bool = False,
                         own_aggregation: str | None = None) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering a policy loss (verl's name and call, see the module docstring).

    The registered function checks that `config` is a config object and that the loss applies
    `rollout_is_weights` when given them. `own_aggregation`: the loss averages its tokens one fixed way and
    ignores `loss_agg_mode`.
    """

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        takes_weights = applies_rollout_is_weights(fn)

        @functools.wraps(fn)
        def call(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                 rollout_is_weights=None):
            require_config_object(config, f"policy loss {name!r}", ACTOR_CONFIG)
            if rollout_is_weights is None:
                loss, metrics = fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config)
            elif takes_weights:
                loss, metrics = fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                   rollout_is_weights)
            else:
                raise ValueError(f"policy loss {name!r} does not apply rollout_is_weights; it cannot correct "
                                 f"for the rollout policy")
            return loss, LossMetrics(metrics)

        POLICY_LOSS_REGISTRY.add(name, call, override=override)
        _OWN_AGGREGATION[name] = own_aggregation
        return call

    return decorator


def own_aggregation(name: str) -> str | None:
    """How a registered loss averages its tokens when it ignores `loss_agg_mode`, else None."""
    return _OWN_AGGREGATION.get(name)


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The registered loss; an unknown name raises a KeyError listing the registered ones."""
    return POLICY_LOSS_REGISTRY.get(name)


def applies_rollout_is_weights(loss: PolicyLossFn) -> bool:
    """Whether a registered loss multiplies its tokens by `rollout_is_weights` (others refuse them)."""
    return "rollout_is_weights" in inspect.signature(loss).parameters


def _apply_is_weights(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """Per-token losses times the rollout importance weights (batch, response_len), when given."""
    if rollout_is_weights is None:
        return pg_losses
    if rollout_is_weights.shape != pg_losses.shape:
        raise ValueError(f"rollout_is_weights has shape {tuple(rollout_is_weights.shape)}; the per-token "
                         f"losses have {tuple(pg_losses.shape)}")
    return pg_losses * rollout_is_weights.detach()  # weights change the sampling measure, not the objective


def _weighted_agg(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None, response_mask: torch.Tensor,
                  loss_agg_mode: str, config: LossConfig) -> torch.Tensor:
    """The per-token losses times the IS weights (when given), aggregated over `config.global_batch_info`."""
    return agg_loss(_apply_is_weights(pg_losses, rollout_is_weights), response_mask, loss_agg_mode,
                    **config.global_batch_info)


def _clip_bounds(config: LossConfig, loss: str | None = None) -> tuple[float, float]:
    """(eps_low, eps_high): clip_ratio_low / clip_ratio_high, each falling back to clip_ratio, both >= 0. eps_low
    must be < 1 too, unless `loss` names one whose bounds are not a clip of rho at 1 - eps_low."""
    low = config.clip_ratio if config.clip_ratio_low is None else config.clip_ratio_low
    high = config.clip_ratio if config.clip_ratio_high is None else config.clip_ratio_high
    if low < 0 or high < 0 or (loss is None and low >= 1):
        need = "0 <= clip_ratio_low < 1" if loss is None else "clip_ratio_low >= 0"
        who = "PPO's clipped ratio" if loss is None else f"the {loss} policy loss"
        raise ValueError(f"{who} needs {need} and clip_ratio_high >= 0, got low={low}, high={high}")
    return low, high


def _log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    return torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # exp() stays finite


def _clipped_surrogate(advantages: torch.Tensor, ratio: torch.Tensor, low: float,
                       high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's max(-A rho, -A clip(rho, 1 - low, 1 + high)) per token, and where the clipped term is larger."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def _dual_clipped(advantages: torch.Tensor, ratio: torch.Tensor, low: float, high: float,
                  clip_ratio_c: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_clipped_surrogate`, for A < 0 at most -A c (Ye et al. 2020): the per-token loss, where PPO's clip
    applied and where the dual clip did."""
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip bound) must be > 1.0, got {clip_ratio_c}")
    ppo, clipped = _clipped_surrogate(advantages, ratio, low, high)
    dual = -advantages * clip_ratio_c
    per_token = torch.where(advantages < 0, torch.minimum(ppo, dual), ppo)
    return per_token, clipped, (ppo > dual) & (advantages < 0)


@torch.no_grad()
def _loss_metrics(loss: torch.Tensor, response_mask: torch.Tensor, ppo_kl: torch.Tensor | None = None,
                  clipfrac: torch.Tensor | None = None, clipfrac_lower: torch.Tensor | None = None) -> dict:
    """pg_clipfrac, pg_clipfrac_lower, ppo_kl: masked means of per-token values (bools as 0/1), 0 for None."""

    def mean(values: torch.Tensor | None) -> torch.Tensor:
        if values is None:
            return loss.new_zeros(())
        return masked_mean(values.float() if values.dtype == torch.bool else values, response_mask)

    return {"pg_clipfrac": mean(clipfrac), "pg_clipfrac_lower": mean(clipfrac_lower), "ppo_kl": mean(ppo_kl)}


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: LossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017, https://arxiv.org/abs/1707.06347) with
    asymmetric clipping (DAPO clip-higher, https://arxiv.org/abs/2503.14476) and dual clip
    (Ye et al. 2020, https://arxiv.org/abs/1912.09729).

    rho = exp(logp - old_logp);  L = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high)), and for A < 0
    L = min(L, -A c). pg_clipfrac / pg_clipfrac_lower: share of tokens clipped / dual-clipped.
    """
    low, high = _clip_bounds(config)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    pg_losses, clipped, dual_clipped = _dual_clipped(advantages, torch.exp(log_ratio), low, high,
                                                     config.clip_ratio_c)  # (batch, response_len) each
    loss = _weighted_agg(pg_losses, rollout_is_weights, response_mask, loss_agg_mode, config)
    return loss, _loss_metrics(loss, response_mask, -log_ratio, clipped, dual_clipped)


@register_policy_loss("gspo", own_aggregation="seq-mean-token-mean")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: LossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Group Sequence Policy Optimization (Zheng et al. 2025, https://arxiv.org/abs/2507.18071).

    Per-sequence ratio s_i = exp((1/|y_i|) sum_t (logp_it - old_logp_it)), clipped to [1 - eps_low,
    1 + eps_high], carried by each token as s_it = sg[s_i] pi(y_it) / sg[pi(y_it)] (the paper's gradient).
    Always "seq-mean-token-mean", as in verl. Typical clip ranges: ~3e-4 / 4e-4.
    """
    low, high = _clip_bounds(config)
    log_ratio = log_prob - old_log_prob  # (batch, response_len)
    seq_log_ratio = masked_mean(log_ratio, response_mask, axis=-1)  # (batch,)
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=10.0))  # (batch, response_len)
    pg_losses, clipped = _clipped_surrogate(advantages, ratio, low, high)
    loss = _weighted_agg(pg_losses, rollout_is_weights, response_mask, "seq-mean-token-mean", config)
    return loss, _loss_metrics(loss, response_mask, -log_ratio, clipped)


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: LossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Group Policy Gradient (Chu et al. 2025, https://arxiv.org/abs/2504.02546): plain REINFORCE
    with no ratio and no clipping, L = -A * logp. Pair it with the `gpg` advantage estimator."""
    loss = _weighted_agg(-log_prob * advantages, rollout_is_weights, response_mask, loss_agg_mode, config)
    return loss, _loss_metrics(loss, response_mask)


@torch.no_grad()
def _token_covariance(advantages: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(A - mean A)(logp - mean logp) per token (batch, response_len): Cov(A, logp)'s terms."""
    return (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob, mask))


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: LossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-Cov (Cui et al. 2025, https://arxiv.org/abs/2505.22617).

    PPO's clip without the dual clip; then max(1, int(clip_cov_ratio * n_tokens)) random valid, unclipped
    tokens whose covariance term lies in (clip_cov_lb, clip_cov_ub) get loss 0, against entropy collapse.
    pg_clipfrac: the share removed that way.
    """
    settings = config.policy_loss
    if settings.clip_cov_ratio <= 0:
        raise ValueError(f"policy_loss.clip_cov_ratio must be > 0, got {settings.clip_cov_ratio}")
    low, high = _clip_bounds(config)
    valid = response_mask != 0
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)  # (batch, response_len)
    ppo, clipped = _clipped_surrogate(advantages, ratio, low, high)
    with torch.no_grad():
        cov = _token_covariance(advantages, log_prob, response_mask)
        eligible = valid & ~clipped & (cov > settings.clip_cov_lb) & (cov < settings.clip_cov_ub)
        candidates = torch.nonzero(eligible.reshape(-1)).squeeze(-1)  # flat positions
        n_pick = min(max(int(settings.clip_cov_ratio * int(valid.sum())), 1), candidates.numel())
        # drawn from the CPU generator: the same picks for a seed on any device
        order = torch.randperm(candidates.numel(), device="cpu")[:n_pick].to(candidates.device)
        keep = torch.ones(valid.shape, dtype=log_prob.dtype, device=log_prob.device)  # 0 on dropped tokens
        keep.view(-1)[candidates[order]] = 0
    pg_losses = ppo * keep
    loss = _weighted_agg(pg_losses, rollout_is_weights, response_mask, loss_agg_mode, config)
    return loss, _loss_metrics(loss, response_mask, -log_ratio, keep == 0)


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: LossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-Cov (Cui et al. 2025, https://arxiv.org/abs/2505.22617).

    -A rho on every token, plus ppo_kl_coef * |logp - old_logp| on the top max(1, int(kl_cov_ratio *
    n_tokens)) valid tokens by covariance term. ppo_kl reports mean |logp - old_logp| (as verl).
    """
    kl_cov_ratio, ppo_kl_coef = config.policy_loss.kl_cov_ratio, config.policy_loss.ppo_kl_coef
    if kl_cov_ratio <= 0:
        raise ValueError(f"policy_loss.kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    valid = response_mask != 0
    log_ratio = log_prob - old_log_prob
    abs_kl = log_ratio.abs()
    ratio = torch.exp(log_ratio)  # (batch, response_len)
    plain = -advantages * ratio
    with torch.no_grad():
        cov = _token_covariance(advantages, log_prob, response_mask).masked_fill(~valid, -torch.inf)
        n_valid = int(valid.sum())
        n_pick = max(1, int(n_valid * kl_cov_ratio)) if n_valid > 0 else 0
        picked = torch.zeros(valid.shape, dtype=torch.bool, device=valid.device)  # (batch, response_len)
        picked.view(-1)[torch.topk(cov.reshape(-1), n_pick).indices] = True
    pg_losses = torch.where(picked, plain + ppo_kl_coef * abs_kl, plain)
    loss = _weighted_agg(pg_losses, rollout_is_weights, response_mask, loss_agg_mode, config)
    return loss, _loss_metrics(loss, response_mask, abs_kl)


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: LossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Direct Reward Optimization (Richemond et al. 2024, https://arxiv.org/abs/2405.19107) as a policy loss:
    L = -(A * logp - beta/2 * (logp - old_logp)^2), beta = actor.policy_loss.dro_beta > 0; no ratio, no clip.
    """
    dro_beta = config.policy_loss.dro_beta
    if dro_beta is None or dro_beta <= 0:
        raise ValueError(f"the dro policy loss needs actor.policy_loss.dro_beta > 0, got {dro_beta}")
    log_ratio = log_prob - old_log_prob  # (batch, response_len)
    pg_losses = -(log_prob * advantages - 0.5 * dro_beta * log_ratio.square())
    loss = _weighted_agg(pg_losses, rollout_is_weights, response_mask, loss_agg_mode, config)
    return loss, _loss_metrics(loss, response_mask, -log_ratio)


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: float | torch.Tensor | None = None,
    global_batch_size: float | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped value loss (Schulman et al. 2017, https://arxiv.org/abs/1707.06347; as OpenAI baselines).

    V_clip = values + clip(vpreds - values, -c, c);  L = 0.5 * agg(max((vpreds - R)^2, (V_clip - R)^2)).
    vpreds, returns, values (rollout-time predictions): (batch, response_len). dp_size, batch_num_tokens,
    global_batch_size and loss_scale_factor are the mini-batch totals `agg_loss` normalises by (verl's call).
    Returns vf_loss and vf_clipfrac, the share of valid tokens where the clipped term was larger.
    """
    if cliprange_value < 0:
        raise ValueError(f"cliprange_value (critic.cliprange_value) must be >= 0, got {cliprange_value}")
    vpred_clipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.max(loss_unclipped, loss_clipped), response_mask, loss_agg_mode, dp_size=dp_size,
                             batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size,
                             loss_scale_factor=loss_scale_factor)
    with torch.no_grad():
        vf_clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac

