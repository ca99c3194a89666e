"""`naive`: score each response on its own, one call at a time (verl's default manager)."""

from __future__ import annotations

from hybridrl.rewards.managers.base import DecodedRow, RewardManager, split_result
from hybridrl.rewards.managers.registry import REWARD_MANAGERS


@REWARD_MANAGERS.register("naive")
class NaiveRewardManager(RewardManager):
    def score_rows(self, rows: list[DecodedRow]) -> list[tuple[float, dict]]:
        return [
            split_result(self.compute_score(
                data_source=row.data_source, solution_str=row.response_str,
                ground_truth=row.ground_truth, extra_info=row.extra_info,
            ))
            for row in rows
        ]
