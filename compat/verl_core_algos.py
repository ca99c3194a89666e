"""verl's `verl.trainer.ppo.core_algos` and `verl.trainer.ppo.rollout_corr_helper` over hybridrl.algos, for
code and tests written against verl (compat/verl_shim.py maps those names here).

Every name of hybridrl.algos and hybridrl.algos.rollout_correction, and what only verl's call conventions
need: an estimator registry that verl code may rebind to a dict of its own (verl's registry tests do), the
deprecated `compute_policy_loss`, bypass mode's loss with its options on the actor config, rollout
correction returning its weights as a DataProto, and verl's `compute_rewards` and `compute_entropy_loss`,
which hybridrl's trainer does not call.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

import torch
from verl_protocol import DataProto

from hybridrl import algos as core
from hybridrl.algos import *  # noqa: F403 - core_algos holds every name of hybridrl.algos
from hybridrl.algos.rollout_correction import *  # noqa: F403 - rollout_corr_helper holds these names
from hybridrl.algos.rollout_correction import compute_policy_loss_bypass_mode as core_bypass_mode
from hybridrl.algos.rollout_correction import compute_rollout_correction
from hybridrl.utils.torch_functional import entropy_from_logits
from hybridrl.workers.config import ActorConfig

# verl's defaults for the options under config.policy_loss.rollout_correction
VERL_BYPASS_OPTIONS = {"loss_type": "ppo_clip", "rollout_is": None, "rollout_is_threshold": 2.0,
                       "rollout_is_batch_normalize": False, "rollout_rs": None, "rollout_rs_threshold": None}


def _rebound_registry() -> Mapping[str, Any] | None:
    """The dict verl code bound to this module's ADV_ESTIMATOR_REGISTRY in place of the core's, else None."""
    registry = globals()["ADV_ESTIMATOR_REGISTRY"]
    return None if registry is core.ADV_ESTIMATOR_REGISTRY else registry


def register_adv_est(name_or_enum: Any, *, needs_critic: bool | None = None,
                     override: bool = False) -> Callable[[Any], Any]:
    """The core's `register_adv_est`, or into the dict verl code rebound ADV_ESTIMATOR_REGISTRY to."""
    registry = _rebound_registry()
    if registry is None:
        return core.register_adv_est(name_or_enum, needs_critic=needs_critic, override=override)
    name = getattr(name_or_enum, "value", name_or_enum)

    def decorator(fn: Any) -> Any:
        current = registry.get(name)
        if current is not None and current is not fn and not override:
            raise ValueError(f"advantage estimator {name!r} is already registered ({current!r})")
        registry[name] = fn
        return fn

    return decorator


def get_adv_estimator_fn(name_or_enum: Any) -> Any:
    """The core's `get_adv_estimator_fn`, or a lookup in the dict verl code rebound ADV_ESTIMATOR_REGISTRY to."""
    registry = _rebound_registry()
    if registry is None:
        return core.get_adv_estimator_fn(name_or_enum)
    name = getattr(name_or_enum, "value", name_or_enum)
    if name not in registry:
        raise ValueError(f"Unknown advantage estimator simply: {name}")
    return registry[name]


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
    """Deprecated (as in verl): `compute_policy_loss_vanilla` with `cliprange*`, returning (pg_loss,
    pg_clipfrac, ppo_kl, pg_clipfrac_lower)."""
    warnings.warn("compute_policy_loss is deprecated: use compute_policy_loss_vanilla (an actor config, returns "
                  "(loss, metrics))", DeprecationWarning, stacklevel=2)
    clip_ratio = next((c for c in (cliprange, cliprange_low, cliprange_high) if c is not None), None)
    if clip_ratio is None:
        raise ValueError("compute_policy_loss needs cliprange (or cliprange_low / cliprange_high)")
    config = ActorConfig(clip_ratio=clip_ratio, clip_ratio_low=cliprange_low, clip_ratio_high=cliprange_high,
                         clip_ratio_c=clip_ratio_c)
    loss, metrics = core.compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask,
                                                     loss_agg_mode, config)
    return loss, metrics["pg_clipfrac"], metrics["ppo_kl"], metrics["pg_clipfrac_lower"]


def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's call of bypass mode's loss: its options on `config.policy_loss.rollout_correction` (verl's
    defaults for those left out), PPO's clip by the `vanilla` loss; `rollout_is_weights` is unused, since
    the loss computes its own, as in verl."""
    policy_loss = getattr(config, "policy_loss", None)
    options = getattr(policy_loss, "rollout_correction", None)
    if options is None:
        raise ValueError("bypass mode's loss in verl's call needs config.policy_loss.rollout_correction (loss_type, "
                         "rollout_is, rollout_rs, ...), as verl's trainer sets it")
    options = options if isinstance(options, Mapping) else vars(options)
    correction = SimpleNamespace(**{**VERL_BYPASS_OPTIONS, **options})
    actor = copy.copy(config)  # the same settings, with verl's ppo_clip loss: vanilla
    actor.policy_loss = copy.copy(policy_loss)
    actor.policy_loss.loss_mode = "vanilla"
    return core_bypass_mode(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, actor, correction)


def compute_rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
    rollout_is: str | None = None, rollout_is_threshold: str | float | None = 2.0,
    rollout_is_batch_normalize: bool = False, rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
) -> tuple[DataProto | None, torch.Tensor, dict[str, float]]:
    """`compute_rollout_correction` with the IS weights as a DataProto of batch key `rollout_is_weights`
    (None without rollout_is), as verl returns them."""
    weights, mask, metrics = compute_rollout_correction(
        old_log_prob, rollout_log_prob, response_mask, rollout_is=rollout_is,
        rollout_is_threshold=rollout_is_threshold, rollout_is_batch_normalize=rollout_is_batch_normalize,
        rollout_rs=rollout_rs, rollout_rs_threshold=rollout_rs_threshold)
    proto = DataProto.from_dict({"rollout_is_weights": weights}) if weights is not None else None
    return proto, mask, metrics


def compute_rewards(token_level_scores: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor,
                    kl_ratio: float) -> torch.Tensor:
    """r_t = score_t - beta * (logp_t - ref_logp_t): the k1 KL-shaped reward of InstructGPT-style RLHF
    (hybridrl's trainer shapes rewards with `apply_kl_penalty`)."""
    return token_level_scores - kl_ratio * (old_log_prob - ref_log_prob)


def compute_entropy_loss(logits: torch.Tensor, response_mask: torch.Tensor,
                         loss_agg_mode: str = "token-mean") -> torch.Tensor:
    """Aggregated entropy of the next-token distributions, logits (batch, response_len, vocab)."""
    return core.agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)
