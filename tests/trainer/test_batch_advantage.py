"""Batch-level advantages: every input the batch has goes to the estimator, its settings from the algorithm
config."""

import pytest
import torch
from ppo_helpers import scored_batch

from hybridrl.trainer.dataflow import compute_advantage
from hybridrl.trainer.ppo_config import AlgorithmConfig


def test_grpo_on_a_batch_writes_advantages_and_returns():
    data = scored_batch([1.0, 3.0], [[1, 1], [1, 0]], ["p", "p"])
    compute_advantage(data, "grpo", AlgorithmConfig())
    # mean 2, unbiased std sqrt(2): (1 - 2) / 1.414 = -0.7071 on both tokens, +0.7071 on the valid one
    expected = torch.tensor([[-0.70711, -0.70711], [0.70711, 0.0]])
    torch.testing.assert_close(data.batch["advantages"], expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(data.batch["returns"], data.batch["advantages"])


def test_settings_come_from_the_algorithm_config():
    data = scored_batch([0.0, 4.0], [[1, 1], [1, 1]], ["p", "q"])
    compute_advantage(data, "reinforce_plus_plus", AlgorithmConfig(gamma=0.5))
    # row 1 returns: 0.5 * 4 = 2 then 4
    torch.testing.assert_close(data.batch["returns"][1], torch.tensor([2.0, 4.0]))
    with pytest.raises(TypeError, match=r"the algorithm config \(algorithm.\*\); got 0.9"):
        compute_advantage(data, "gae", 0.9)  # verl's positional gamma
