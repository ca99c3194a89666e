"""Reward managers, registered by name (`reward_model.reward_manager`): naive, batch, prime, dapo."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from hybridrl.rewards.custom import get_custom_reward_fn
from hybridrl.rewards.managers import batch, dapo, naive, prime  # noqa: F401  (registers the managers)
from hybridrl.rewards.managers.base import RewardManager
from hybridrl.rewards.managers.registry import REWARD_MANAGERS
from hybridrl.rewards.sandbox import SandboxConfig
from hybridrl.rewards.score import default_compute_score

__all__ = ["REWARD_MANAGERS", "RewardManager", "load_reward_manager"]


def load_reward_manager(config: Mapping[str, Any], tokenizer: Any, num_examine: int = 0, **kwargs: Any) -> RewardManager:
    """Build the manager named by `config.reward_model.reward_manager` (verl's `load_reward_manager`).

    The scorer is the custom function (`custom_reward_function.path/name/reward_kwargs`) when one is
    set, else `default_compute_score` with the code sandbox set by `reward_model.sandbox.*`.
    `reward_model.reward_kwargs` and `kwargs` go to the manager.
    """
    reward_model = config.get("reward_model") or {}
    cls = REWARD_MANAGERS.get(reward_model.get("reward_manager") or "naive")
    manager_kwargs = {**cls.config_kwargs(config), **dict(reward_model.get("reward_kwargs") or {}), **kwargs}
    reward_fn_key = (config.get("data") or {}).get("reward_fn_key") or "data_source"
    sandbox_limits = SandboxConfig(**(reward_model.get("sandbox") or {})).limits()
    compute_score = get_custom_reward_fn(config) or functools.partial(default_compute_score,
                                                                      sandbox_limits=sandbox_limits)
    return cls(tokenizer=tokenizer, num_examine=num_examine, compute_score=compute_score,
               reward_fn_key=reward_fn_key, **manager_kwargs)
