"""`prime`: score responses in parallel processes with a per-sample timeout (verl's PrimeRewardManager).

A sample whose scorer hangs past `timeout` seconds, raises, or kills its process scores 0; the batch
goes on. Per-sample flags `reward_timeout` and `reward_error` land in the extra info (their batch mean
is the fraction affected) and running totals in `num_timeouts` / `num_errors`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridrl.rewards.managers.base import DecodedRow, RewardManager, split_result
from hybridrl.rewards.managers.registry import REWARD_MANAGERS
from hybridrl.rewards.pool import default_num_workers, score_in_pool


@REWARD_MANAGERS.register("prime")
class PrimeRewardManager(RewardManager):
    def __init__(
        self,
        tokenizer: Any,
        num_examine: int = 0,
        compute_score: Callable[..., Any] | None = None,
        reward_fn_key: str = "data_source",
        timeout: float = 300.0,
        num_processes: int | None = None,
    ) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key)
        self.timeout = timeout
        self.num_processes = num_processes or default_num_workers()
        self.num_timeouts = 0
        self.num_errors = 0

    def score_rows(self, rows: list[DecodedRow]) -> list[tuple[float, dict]]:
        kwargs = [
            {"data_source": r.data_source, "solution_str": r.response_str,
             "ground_truth": r.ground_truth, "extra_info": r.extra_info}
            for r in rows
        ]
        outcomes = score_in_pool(self.compute_score, kwargs, self.num_processes, self.timeout)
        results = []
        for outcome in outcomes:
            timed_out, failed = outcome.status == "timeout", outcome.status in ("error", "crash")
            self.num_timeouts += timed_out
            self.num_errors += failed
            score, extras = split_result(outcome.value) if outcome.status == "ok" else (0.0, {})
            results.append((score, {**extras, "reward_timeout": timed_out, "reward_error": failed}))
        return results
