"""Building a run's reward manager from its config (verl's `verl.trainer.ppo.reward.load_reward_manager`).

It lives with the trainer, not in `hybridrl.rewards.managers`, because it reads the trainer's config
schema (`DataConfig`, `RewardModelConfig`), and the reward model worker's config imports the managers.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from hybridrl.rewards.custom import get_custom_reward_fn
from hybridrl.rewards.managers import REWARD_MANAGERS, RewardManager
from hybridrl.rewards.scorers import default_compute_score
from hybridrl.trainer.ppo_config import DataConfig
from hybridrl.utils.typed_config import to_dataclass
from hybridrl.workers.reward_model import RewardModelConfig

__all__ = ["load_reward_manager"]


def load_reward_manager(config: Mapping[str, Any], tokenizer: Any, num_examine: int = 0, **kwargs: Any) -> RewardManager:
    """Build the manager named by `config.reward_model.reward_manager` (verl's `load_reward_manager`).

    `config` is the PPO config as a plain mapping; a section or key it lacks takes the schema's default
    (the typed configs are the one home of those). The scorer is the custom function
    (`custom_reward_function.path/name/reward_kwargs`) when one is set, else `default_compute_score` with
    the code sandbox set by `reward_model.sandbox.*`. `reward_model.reward_kwargs` and `kwargs` go to the
    manager.
    """
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
