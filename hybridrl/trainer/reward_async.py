"""Rule-based rewards scored in a background thread of the driver (`reward_model.launch_reward_fn_async`).

The reward functions run in the reward manager's worker processes (hybridrl/rewards/pool.py), so
the driver thread that waits for them is idle; a background thread waits instead, and the driver drives
the workers' log-prob and value passes meanwhile. The scores are the same as when scored in line: the
thread scores the same rows, and the trainer waits for them before it needs them (the KL penalty and
the advantages).

The thread gets its own shallow copy of the batch (the tensors are shared, not copied): the trainer
keeps adding keys to the original (old_log_probs, values), and the manager must not see the dict
change under it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from hybridrl.protocol import DataProto

RewardFn = Callable[..., dict[str, Any]]


class BackgroundReward:
    """One background thread that scores batches with `reward_fn(batch, return_dict=True)`."""

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
