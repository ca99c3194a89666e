"""GDPO: each reward component normalised within its group, summed with weights, whitened over the batch."""

import math

import numpy as np
import pytest
import torch

from hybridrl.algos import (
    AdvantageEstimator,
    compute_gdpo_outcome_advantage,
    compute_grpo_outcome_advantage,
    get_adv_estimator_fn,
)
from hybridrl.algos.advantage import GDPOInputError
from hybridrl.trainer.ppo_config import AlgorithmConfig
from hybridrl.utils.torch_functional import masked_whiten

INDEX = np.array(["a", "a", "b", "b"], dtype=object)
COMPONENTS = {"accuracy": np.array([1.0, 0.0, 0.0, 1.0]), "format": np.array([0.0, 1.0, 0.0, 1.0], dtype=object)}


def gdpo(keys=("accuracy", "format"), weights=None, components=COMPONENTS, mask=None):
    mask = torch.ones(4, 3) if mask is None else mask
    config = AlgorithmConfig(adv_estimator="gdpo", gdpo_reward_keys=list(keys), gdpo_reward_weights=weights)
    return compute_gdpo_outcome_advantage(torch.zeros(4, 3), mask, INDEX, config=config, non_tensor_batch=components)


def test_components_cancel_or_add_as_worked_by_hand():
    # group a: accuracy (1, 0) -> (+0.707, -0.707), format (0, 1) -> (-0.707, +0.707): the sum is 0 for both.
    # group b: both components (0, 1) -> sum (-1.414, +1.414). Whitened over the 12 tokens (mean 0, unbiased
    # var = 6 tokens x 2 / 11) -> +-1.414 / sqrt(12 / 11) = +-1.354
    advantages, returns = gdpo()
    expected = math.sqrt(2) / math.sqrt(12 / 11)
    torch.testing.assert_close(advantages, returns)
    torch.testing.assert_close(advantages[:, 0], torch.tensor([0.0, 0.0, -expected, expected]), atol=1e-5, rtol=0)
    assert torch.all(advantages == advantages[:, :1])  # one value per response, on every valid token


def test_weights_scale_components_and_their_count_must_match():
    unweighted, _ = gdpo(weights=[1.0, 1.0])
    weighted, _ = gdpo(weights=[1.0, 3.0])
    assert weighted[0, 0] < 0 < weighted[1, 0]  # group a: format now outweighs accuracy
    assert not torch.allclose(unweighted, weighted)
    with pytest.raises(GDPOInputError, match="gdpo_reward_weights has 1 weight"):
        gdpo(weights=[1.0])
    with pytest.raises(AssertionError):  # what verl raises, for code written against it
        gdpo(weights=[1.0, 2.0, 3.0])


def test_missing_or_empty_components_name_the_key():
    with pytest.raises(ValueError, match="'format'.*not among the batch's reward outputs"):
        gdpo(components={"accuracy": COMPONENTS["accuracy"]})
    with pytest.raises(ValueError, match="'format': row 2 holds None"):
        gdpo(components={**COMPONENTS, "format": np.array([0.0, 1.0, None, 1.0], dtype=object)})
    with pytest.raises(ValueError, match="requires algorithm.gdpo_reward_keys"):
        compute_gdpo_outcome_advantage(torch.zeros(4, 3), torch.ones(4, 3), INDEX, config=AlgorithmConfig())


def test_without_components_it_is_grpo_then_batch_whitening():
    rewards = torch.zeros(4, 3)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 0.3, 0.9])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.float32)
    advantages, _ = compute_gdpo_outcome_advantage(rewards, mask, INDEX)
    grpo, _ = compute_grpo_outcome_advantage(rewards, mask, INDEX)
    torch.testing.assert_close(advantages, masked_whiten(grpo, mask) * mask)


def test_padding_stays_zero_and_the_estimator_is_registered():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]], dtype=torch.float32)
    advantages, _ = gdpo(mask=mask)
    assert torch.all(advantages[mask == 0] == 0)
    assert get_adv_estimator_fn("gdpo") is compute_gdpo_outcome_advantage
    assert get_adv_estimator_fn(AdvantageEstimator.GDPO) is compute_gdpo_outcome_advantage
