"""KL estimators between the policy and the reference, registered by name, and the KL controllers.

With x = logp - ref_logp of the sampled token, the estimators of KL(pi || pi_ref) (J. Schulman,
"Approximating KL divergence", http://joschu.net/blog/kl-approx.html):

    kl / k1         x                       unbiased, high variance, can be negative
    abs             |x|
    mse / k2        x^2 / 2                 biased, low variance, >= 0
    low_var_kl / k3 exp(-x) - 1 + x         unbiased, low variance, >= 0; clamped to [-10, 10] as verl
    full            sum_v p_v (log p_v - log q_v) from full distributions (..., vocab): exact

A "+" suffix ("k3+") keeps the value but takes k2's gradient, the KL's unbiased gradient as a loss
(verl's straight-through option).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from hybridrl.utils.registry import Registry
from hybridrl.utils.torch_functional import masked_mean

KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KL_PENALTY_REGISTRY: Registry[KLFn] = Registry("kl_penalty")


def register_kl_penalty(*names: str) -> Callable[[KLFn], KLFn]:
    """Register `fn(logprob, ref_logprob) -> per-token KL` under one or more names (aliases)."""

    def decorator(fn: KLFn) -> KLFn:
        for name in names:
            KL_PENALTY_REGISTRY.add(name, fn)
        return fn

    return decorator


@register_kl_penalty("kl", "k1")
def _kl_k1(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return logprob - ref_logprob


@register_kl_penalty("abs")
def _kl_abs(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return (logprob - ref_logprob).abs()


@register_kl_penalty("mse", "k2")
def _kl_k2(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprob - ref_logprob).square()


@register_kl_penalty("low_var_kl", "k3")
def _kl_k3(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    # k3 = r - 1 - log r, r = ref/pi; log r clamped so exp() stays finite, the result to [-10, 10] as verl
    log_r = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(log_r) - log_r - 1, min=-10.0, max=10.0)


@register_kl_penalty("full")
def _kl_full(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    if logprob.dim() < 3 or logprob.shape != ref_logprob.shape:
        raise ValueError(
            "kl_penalty='full' needs full log-probability distributions of shape (batch, response_len, vocab) "
            f"for both policies, got {tuple(logprob.shape)} and {tuple(ref_logprob.shape)}. The per-token "
            "log-probs the trainer stores cannot give the exact KL; use 'low_var_kl' (k3) or 'kl' (k1) there."
        )
    return (logprob.exp() * (logprob - ref_logprob)).sum(dim=-1)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate (batch, response_len); for "full" the inputs add a vocab dimension."""
    straight_through = kl_penalty.endswith("+")
    name = kl_penalty[:-1] if straight_through else kl_penalty
    value = kl_penalty_forward(logprob, ref_logprob, name)
    if not straight_through or name in ("mse", "k2"):
        return value
    surrogate = _kl_k2(logprob, ref_logprob)
    return surrogate - surrogate.detach() + value.detach()


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """The estimator itself, without "+" straight-through (verl's `kl_penalty_forward`)."""
    return KL_PENALTY_REGISTRY.get(kl_penalty)(logprob, ref_logprob)


class FixedKLController:
    """A constant KL coefficient beta."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""


class AdaptiveKLController:
    """Proportional controller for beta (Ziegler et al. 2019, https://arxiv.org/abs/1909.08593).

    e = clip(KL / target - 1, -0.2, 0.2);  beta <- beta * (1 + e * n_steps / horizon).
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        for key, value in (("target_kl", target_kl), ("horizon", horizon)):
            if value <= 0:
                raise ValueError(f"algorithm.kl_ctrl.{key} must be > 0 for the adaptive controller, got {value}")
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + error * n_steps / self.horizon


KLController = FixedKLController | AdaptiveKLController
KL_CONTROLLER_REGISTRY: Registry[Callable[..., KLController]] = Registry("kl controller type")
KL_CONTROLLER_REGISTRY.add("fixed", lambda kl_coef, target_kl, horizon: FixedKLController(kl_coef))
KL_CONTROLLER_REGISTRY.add("adaptive", AdaptiveKLController)


def get_kl_controller(
    type: str = "fixed", kl_coef: float = 0.001, target_kl: float = 0.1, horizon: int = 10000
) -> KLController:
    """Build the controller named by `algorithm.kl_ctrl.type` from the other `kl_ctrl` keys."""
    return KL_CONTROLLER_REGISTRY.get(type)(kl_coef, target_kl, horizon)


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: KLController,
    kl_penalty_type: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-in-reward: r_t = score_t - beta * KL_t on valid tokens, then a controller update with the batch
    mean of the sequences' token-mean KL and n_steps = batch size (as verl). Returns the rewards
    (batch, response_len) and metrics `actor/reward_kl_penalty`, `actor/reward_kl_penalty_coeff` (beta)."""
    mask = response_mask.to(token_level_scores.dtype)
    kld = kl_penalty(old_log_prob, ref_log_prob, kl_penalty_type) * mask  # (batch, response_len)
    beta = kl_ctrl.value
    rewards = token_level_scores - beta * kld
    current_kl = float(masked_mean(kld, mask, axis=-1).mean())
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
