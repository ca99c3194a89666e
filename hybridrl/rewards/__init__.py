"""Rewards: rule-based scorers, custom reward functions, reward managers and the code sandbox."""

from hybridrl.rewards.failures import RewardFailureError, RewardFunctionFatalError
from hybridrl.rewards.scorers import default_compute_score

__all__ = ["RewardFailureError", "RewardFunctionFatalError", "default_compute_score"]
