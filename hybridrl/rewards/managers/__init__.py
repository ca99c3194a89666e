"""Reward managers, registered by name (`reward_model.reward_manager`): naive, batch, prime, dapo."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from hybridrl.rewards.custom import get_custom_reward_fn
from hybridrl.rewards.managers import batch, dapo, naive, prime  # noqa: F401  (registers the managers)
from hybridrl.rewards.managers.base import RewardManager
from hybridrl.rewards.managers.registry import REWARD_MANAGERS
from hybridrl.rewards.score import default_compute_score
from hybridrl.utils.config import to_dataclass

__all__ = ["REWARD_MANAGERS", "RewardManager", "load_reward_manager"]


def load_reward_manager(config: Mapping[str, Any], tokenizer: Any, num_examine: int = 0, **kwargs: Any) -> RewardManager:
    """Build the manager named by `config.reward_model.reward_manager` (verl's `load_reward_manager`).

    `config` is the PPO config as a plain mapping; a section or key it lacks takes the schema's default
    (the typed configs are the one home of those). The scorer is the custom function
    (`custom_reward_function.path/name/reward_kwargs`) when one is set, else `default_compute_score` with
    the code sandbox set by `reward_model.sandbox.*`. `reward_model.reward_kwargs` and `kwargs` go to the
    manager.
    """
    # imported here: the reward model worker's module imports this package (for OverlongBufferConfig)
    from hybridrl.trainer.ppo_config import DataConfig
    from hybridrl.workers.reward_model import RewardModelConfig

    reward_model = to_dataclass(RewardModelConfig, config.get("reward_model") or {})
    data = config.get("data") or {}
    cls = REWARD_MANAGERS.get(reward_model.reward_manager)
    max_response_length = data.get("max_response_length", DataConfig.max_response_length)
    manager_kwargs = {**cls.config_kwargs(reward_model, max_response_length), **reward_model.reward_kwargs,
                      **kwargs}
    compute_score = get_custom_reward_fn(config) or functools.partial(
        default_compute_score, sandbox_limits=reward_model.sandbox.limits())
    return cls(tokenizer=tokenizer, num_examine=num_examine, compute_score=compute_score,
               reward_fn_key=data.get("reward_fn_key", DataConfig.reward_fn_key), **manager_kwargs)
