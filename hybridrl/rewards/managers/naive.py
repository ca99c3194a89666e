"""`naive`: score each response on its own, one call per response (verl's default manager).

The calls run in the base class's worker pool with the per-call timeout (hybridrl/rewards/managers/manager_base.py).
"""

from __future__ import annotations

from hybridrl.rewards.managers.manager_base import RewardManager
from hybridrl.rewards.managers.manager_registry import REWARD_MANAGERS


@REWARD_MANAGERS.register("naive")
class NaiveRewardManager(RewardManager):
    """The base behaviour as it is: one guarded call per row."""
