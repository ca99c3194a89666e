"""`batch`: one call with every response, for verifiers that are faster in bulk (verl's BatchRewardManager).

The function is called as `compute_score(data_sources=[...], solution_strs=[...], ground_truths=[...],
extra_infos=[...], **reward_kwargs)` and returns one float or dict per response.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridrl.rewards.managers.base import DecodedRow, RewardManager, split_result
from hybridrl.rewards.managers.registry import REWARD_MANAGERS


@REWARD_MANAGERS.register("batch")
class BatchRewardManager(RewardManager):
    def __init__(
        self,
        tokenizer: Any,
        num_examine: int = 0,
        compute_score: Callable[..., Any] | None = None,
        reward_fn_key: str = "data_source",
        **reward_kwargs: Any,
    ) -> None:
        if compute_score is None:
            raise ValueError("the batch reward manager needs a batched compute_score; set custom_reward_function.path")
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key)
        self.reward_kwargs = reward_kwargs

    def score_rows(self, rows: list[DecodedRow]) -> list[tuple[float, dict]]:
        results = self.compute_score(
            data_sources=[r.data_source for r in rows],
            solution_strs=[r.response_str for r in rows],
            ground_truths=[r.ground_truth for r in rows],
            extra_infos=[r.extra_info for r in rows],
            **self.reward_kwargs,
        )
        if len(results) != len(rows):
            raise ValueError(f"the batched compute_score returned {len(results)} results for {len(rows)} responses")
        return [split_result(r) for r in results]
