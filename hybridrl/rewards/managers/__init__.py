"""Reward managers, registered by name (`reward_model.reward_manager`): naive, batch, prime, dapo.

Built from a run's config by `hybridrl.trainer.reward.load_reward_manager`, which reads the trainer's
config schema (a layer above this package).
"""

from __future__ import annotations

from hybridrl.rewards.managers import batch, dapo, naive, prime  # noqa: F401  (registers the managers)
from hybridrl.rewards.managers.manager_base import RewardManager
from hybridrl.rewards.managers.manager_registry import REWARD_MANAGERS

__all__ = ["REWARD_MANAGERS", "RewardManager"]
