"""Reward managers, registered by name (`reward_model.reward_manager`): naive, batch, prime, dapo."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hybridrl.rewards.custom import get_custom_reward_fn
from hybridrl.rewards.managers import batch, dapo, naive, prime  # noqa: F401  (registers the managers)
from hybridrl.rewards.managers.base import RewardManager
from hybridrl.rewards.managers.registry import REWARD_MANAGERS

__all__ = ["REWARD_MANAGERS", "RewardManager", "load_reward_manager"]


def load_reward_manager(config: Mapping[str, Any], tokenizer: Any, num_examine: int = 0, **kwargs: Any) -> RewardManager:
    """Build the manager named by `config.reward_model.reward_manager` (verl's `load_reward_manager`).

    The scorer is the custom function (`custom_reward_function.path/name/reward_kwargs`) when one is
    set, else `default_compute_score`. `reward_model.reward_kwargs` and `kwargs` go to the manager.
    """
    reward_model = config.get("reward_model") or {}
    cls = REWARD_MANAGERS.get(reward_model.get("reward_manager") or "naive")
    manager_kwargs = {**cls.config_kwargs(config), **dict(reward_model.get("reward_kwargs") or {}), **kwargs}
    reward_fn_key = (config.get("data") or {}).get("reward_fn_key") or "data_source"
    return cls(tokenizer=tokenizer, num_examine=num_examine, compute_score=get_custom_reward_fn(config),
               reward_fn_key=reward_fn_key, **manager_kwargs)
