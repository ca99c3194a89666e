"""`batch`: one call with every response, for verifiers that are faster in bulk (verl's BatchRewardManager).

The function is called as `compute_score(data_sources=[...], solution_strs=[...], ground_truths=[...],
extra_infos=[...], **reward_kwargs)` and returns one float or dict per response. The call runs in a
worker process under `reward_model.reward_fn_timeout` like any other; a call that raises, crashes, times
out or returns a list of the wrong length fails every row, and a bad item fails its own row only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridrl.rewards.failures import (
    DEFAULT_MAX_FAILURE_SHARE,
    DEFAULT_TIMEOUT_S,
    Outcome,
    Status,
    check_batch_scores,
)
from hybridrl.rewards.managers.manager_base import DecodedRow, RewardManager
from hybridrl.rewards.managers.manager_registry import REWARD_MANAGERS


@REWARD_MANAGERS.register("batch")
class BatchRewardManager(RewardManager):
    check = staticmethod(check_batch_scores)

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int = 0,
        compute_score: Callable[..., Any] | None = None,
        reward_fn_key: str = "data_source",
        timeout: float = DEFAULT_TIMEOUT_S,
        num_workers: int | None = None,
        max_failure_share: float = DEFAULT_MAX_FAILURE_SHARE,
        **reward_kwargs: Any,
    ) -> None:
        if compute_score is None:
            raise ValueError("the batch reward manager needs a batched compute_score; set custom_reward_function.path")
        # (one call per batch: the pool starts one worker however many it may have)
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, timeout, num_workers,
                         max_failure_share)
        self.reward_kwargs = reward_kwargs

    def score_rows(self, rows: list[DecodedRow]) -> list[Outcome]:
        call = {
            "data_sources": [r.data_source for r in rows],
            "solution_strs": [r.response_str for r in rows],
            "ground_truths": [r.ground_truth for r in rows],
            "extra_infos": [r.extra_info for r in rows],
            **self.reward_kwargs,
        }
        (outcome,) = self.runner.map([call])
        if outcome.status is Status.OK:
            return outcome.value
        return [outcome] * len(rows)  # the call failed: so did every row
