"""The advantage-estimator registry and `compute_advantage`, the one uniform way to call an estimator.

An estimator returns `(advantages, returns)`, both (batch, response_len). Its signature declares its
inputs: parameters without defaults are required (`values`, `index`, `reward_baselines`, `gamma`, ...),
those with defaults are settings. `compute_advantage(name, **everything_the_trainer_has)` hands each
estimator what it takes, so the trainer never branches on a name (docs/architecture.md, "One PPO step").
The registry maps names to the functions, as verl's does; whether one can serve (takes
token_level_rewards and response_mask, no *args) is checked when its spec is read, before workers start.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from hybridrl.utils.registry import Registry, UnknownNameError

AdvEstimatorFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]

BASE_INPUTS = ("token_level_rewards", "response_mask")

# where each input comes from, for "missing input" errors
INPUT_SOURCES = {
    "values": "the critic's value estimates (batch key 'values'; configure a critic under critic.*)",
    "index": "the per-sample prompt uid array (non_tensor_batch['uid']), one entry per response",
    "reward_baselines": "the greedy-decoding baseline reward per sample (batch key 'reward_baselines')",
    "non_tensor_batch": "the batch's per-row extras (the reward function's extra outputs among them)",
    "old_log_probs": "the actor's log-probs of the sampled tokens before the update (the old log-prob pass)",
    "sum_pi_squared": "sum over the vocabulary of pi^2 at each response token, from the old log-prob pass "
                      "with actor_rollout_ref.actor.calculate_sum_pi_squared=true",
    "config": "the algorithm config (algorithm.*)",
    "gamma": "algorithm.gamma",
    "lam": "algorithm.lam",
}


class AdvantageEstimator(str, Enum):
    """verl's enum of built-in estimator names; any registered string works as well."""

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    GPG = "gpg"
    RLOO_VECTORIZED = "rloo_vectorized"
    GRPO_VECTORIZED = "grpo_vectorized"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"
    GDPO = "gdpo"


@dataclass(frozen=True)
class AdvEstimatorSpec:
    """One estimator's declared inputs (besides BASE_INPUTS); `accepts_any_input`: it takes **kwargs."""

    name: str
    fn: AdvEstimatorFn
    required_inputs: tuple[str, ...]
    optional_inputs: tuple[str, ...]
    needs_critic: bool
    accepts_any_input: bool

    @property
    def parameters(self) -> tuple[str, ...]:
        return (*BASE_INPUTS, *self.required_inputs, *self.optional_inputs)


ADV_ESTIMATOR_REGISTRY: Registry[AdvEstimatorFn] = Registry("advantage estimator")
# needs_critic given at registration
_NEEDS_CRITIC: dict[str, bool | None] = {}


def _name_of(name_or_enum: str | Enum) -> str:
    return name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum


def register_adv_est(
    name_or_enum: str | AdvantageEstimator, *, needs_critic: bool | None = None, override: bool = False
) -> Callable[[AdvEstimatorFn], AdvEstimatorFn]:
    """Decorator registering an estimator (verl's `register_adv_est`); its parameters declare its inputs.

    `needs_critic` defaults to "takes a required `values`". Another function under a taken name raises
    unless `override=True`; the same function again is a no-op.
    """
    name = _name_of(name_or_enum)

    def decorator(fn: AdvEstimatorFn) -> AdvEstimatorFn:
        if name not in ADV_ESTIMATOR_REGISTRY or ADV_ESTIMATOR_REGISTRY[name] is not fn:
            ADV_ESTIMATOR_REGISTRY.add(name, fn, override=override)
        _NEEDS_CRITIC[name] = needs_critic
        return fn

    return decorator


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> AdvEstimatorFn:
    """The registered estimator (verl's name); an unknown name raises a KeyError that is also a ValueError."""
    name = _name_of(name_or_enum)
    if name not in ADV_ESTIMATOR_REGISTRY:
        known = ", ".join(ADV_ESTIMATOR_REGISTRY.names()) or "(none)"
        raise UnknownNameError(f"Unknown advantage estimator simply: {name}; registered: {known}")
    return ADV_ESTIMATOR_REGISTRY[name]


def get_adv_estimator_spec(name_or_enum: str | AdvantageEstimator) -> AdvEstimatorSpec:
    """The inputs a registered estimator declares; raises if it cannot serve as an estimator."""
    name = _name_of(name_or_enum)
    fn = get_adv_estimator_fn(name)
    required: list[str] = []
    optional: list[str] = []
    accepts_any = False
    params = inspect.signature(fn).parameters
    for param in params.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            accepts_any = True
        elif param.kind is inspect.Parameter.VAR_POSITIONAL:
            raise TypeError(f"advantage estimator {name!r}: *args is not supported; name every input")
        elif param.name not in BASE_INPUTS:
            (required if param.default is inspect.Parameter.empty else optional).append(param.name)
    missing_base = [b for b in BASE_INPUTS if b not in params]
    if missing_base and not accepts_any:
        raise TypeError(f"advantage estimator {name!r} must accept {', '.join(missing_base)} to be used")
    needs_critic = _NEEDS_CRITIC.get(name)  # None: read from the signature
    needs_critic = "values" in required if needs_critic is None else needs_critic
    return AdvEstimatorSpec(name, fn, tuple(required), tuple(optional), needs_critic, accepts_any)


def compute_advantage(
    adv_estimator: str | AdvantageEstimator,
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    **available_inputs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a registered estimator on the `available_inputs` its signature asks for; returns (advantages,
    returns), (batch, response_len) each. Inputs it does not take are ignored; None counts as absent."""
    spec = get_adv_estimator_spec(adv_estimator)
    given = {key: value for key, value in available_inputs.items() if value is not None}
    missing = [key for key in spec.required_inputs if key not in given]
    if missing:
        details = "; ".join(f"{key}: {INPUT_SOURCES.get(key, 'no default source')}" for key in missing)
        raise ValueError(
            f"advantage estimator {spec.name!r} needs input(s) {missing} that were not given ({details})"
        )
    given.update(token_level_rewards=token_level_rewards, response_mask=response_mask)
    kwargs = given if spec.accepts_any_input else {k: given[k] for k in spec.parameters if k in given}
    advantages, returns = spec.fn(**kwargs)
    expected = tuple(token_level_rewards.shape)
    for label, tensor in (("advantages", advantages), ("returns", returns)):
        if tuple(tensor.shape) != expected:
            raise ValueError(
                f"advantage estimator {spec.name!r} returned {label} of shape {tuple(tensor.shape)}; "
                f"expected (batch, response_len) = {expected}"
            )
    return advantages, returns
