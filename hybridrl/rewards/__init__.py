"""Rewards: rule-based scorers, custom reward functions, reward managers and the code sandbox."""

from hybridrl.rewards.score import default_compute_score

__all__ = ["default_compute_score"]
