"""A run's reward function on the driver: the reward manager built from the config, and background scoring.

`load_reward_manager` is verl's `verl.trainer.ppo.reward.load_reward_manager`. It lives with the
trainer, not in `hybridrl.rewards.managers`, because it reads the trainer's config schema
(`DataConfig`, `RewardModelConfig`), and the reward model worker's config imports the managers.
`BackgroundReward` scores a batch in a thread of the driver (`reward_model.launch_reward_fn_async`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from hybridrl.protocol import DataProto
from hybridrl.rewards.custom import get_custom_reward_fn
from hybridrl.rewards.managers import REWARD_MANAGERS, RewardManager
from hybridrl.rewards.scorers import default_compute_score
from hybridrl.trainer.ppo_config import DataConfig
from hybridrl.utils.typed_config import to_dataclass
from hybridrl.workers.reward_model import RewardModelConfig

__all__ = ["BackgroundReward", "load_reward_manager"]


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


RewardFn = Callable[..., dict[str, Any]]


class BackgroundReward:
    """One background thread that scores batches with `reward_fn(batch, return_dict=True)`.

    The reward functions run in the reward manager's worker processes (hybridrl/rewards/pool.py),
    so the driver thread that waits for them is idle; a background thread waits instead, and the driver
    drives the workers' log-prob and value passes meanwhile. The scores are the same as when scored in
    line: the thread scores the same rows, and the trainer waits for them before it needs them (the KL
    penalty and the advantages). The thread gets its own shallow copy of the batch (the tensors are
    shared, not copied): the trainer keeps adding keys to the original (old_log_probs, values), and the
    manager must not see the dict change under it.
    """

    def __init__(self, reward_fn: RewardFn) -> None:
        self.reward_fn = reward_fn
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hybridrl-reward")

    def submit(self, batch: DataProto) -> Future[dict[str, Any]]:
        """Start scoring `batch`; `.result()` returns the manager's dict or raises what it raised."""
        snapshot = batch.select(deepcopy=False)
        return self._executor.submit(self.reward_fn, snapshot, return_dict=True)

    def close(self) -> None:
        """Wait for a scoring in flight (bounded by reward_model.reward_fn_timeout) and stop the thread."""
        self._executor.shutdown(wait=True)
