"""rollout_logprob_diff_metrics: masked max/mean of |rollout - old| log-probs."""

from __future__ import annotations

import pytest
import torch

from hybridrl.workers.rollout import rollout_logprob_diff_metrics


def test_masked_max_and_mean():
    rollout = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 9.0]])
    old = torch.tensor([[-1.1, -2.0, -2.0], [-0.25, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # |diff| on masked-in tokens: .1, 0, 1, .25, 0 (the 9.0 vs 0.0 pair is masked out)
    # max = 1.0, mean = 1.35 / 5 = 0.27
    metrics = rollout_logprob_diff_metrics(rollout, old, mask)
    assert metrics["rollout/log_prob_diff_max"] == pytest.approx(1.0)
    assert metrics["rollout/log_prob_diff_mean"] == pytest.approx(0.27)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="shape"):
        rollout_logprob_diff_metrics(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="no 1s"):
        rollout_logprob_diff_metrics(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3))
