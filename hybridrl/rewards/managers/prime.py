"""`prime`: score responses in parallel processes with a per-sample timeout (verl's PrimeRewardManager).

Every manager now runs its calls in a worker pool with a timeout (hybridrl/rewards/managers/manager_base.py);
`prime` keeps its own constructor arguments -- `timeout` and `num_processes` through
`reward_model.reward_kwargs`, which override `reward_model.reward_fn_timeout` / `reward_fn_workers` --
and adds per-sample flags `reward_timeout` and `reward_error` (any other failure) to the extra info,
whose batch mean is the fraction affected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridrl.rewards.failures import DEFAULT_MAX_FAILURE_SHARE, DEFAULT_TIMEOUT_S, Outcome, Status
from hybridrl.rewards.managers.manager_base import DecodedRow, RewardManager
from hybridrl.rewards.managers.manager_registry import REWARD_MANAGERS


@REWARD_MANAGERS.register("prime")
class PrimeRewardManager(RewardManager):
    def __init__(
        self,
        tokenizer: Any,
        num_examine: int = 0,
        compute_score: Callable[..., Any] | None = None,
        reward_fn_key: str = "data_source",
        timeout: float = DEFAULT_TIMEOUT_S,
        num_processes: int | None = None,
        num_workers: int | None = None,
        max_failure_share: float = DEFAULT_MAX_FAILURE_SHARE,
    ) -> None:
        workers = num_processes if num_processes is not None else num_workers
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, timeout, workers, max_failure_share)

    def finish(self, row: DecodedRow, outcome: Outcome, score: float, extras: dict) -> tuple[float, dict]:
        timed_out = outcome.status is Status.TIMEOUT
        return score, {**extras, "reward_timeout": timed_out, "reward_error": outcome.status is not Status.OK
                       and not timed_out}
