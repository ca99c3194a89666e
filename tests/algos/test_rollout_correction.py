"""Rollout correction: IS weights, rejection masks and their settings, worked by hand.

One sequence of three tokens: old_log_prob -1 each, rollout_log_prob [-0.5, -3.5, -0.8], so the
log-ratio x = old - rollout = [-0.5, 2.5, -0.2] and the token ratios exp(x) = [0.6065, 12.18, 0.8187].
"""

import math

import pytest
import torch

from hybridrl.algos.rollout_correction import (
    compute_rollout_correction,
    parse_is_threshold,
    parse_rs_options,
)
from hybridrl.trainer.ppo_config import RolloutCorrectionConfig

OLD = torch.tensor([[-1.0, -1.0, -1.0]])
ROLLOUT = torch.tensor([[-0.5, -3.5, -0.8]])
MASK = torch.ones(1, 3)
RATIOS = [math.exp(-0.5), math.exp(2.5), math.exp(-0.2)]


def correct(**settings):
    return compute_rollout_correction(OLD, ROLLOUT, MASK, **settings)


def test_token_weights_truncate_or_icepop():
    weights, mask, metrics = correct(rollout_is="token", rollout_is_threshold=2.0)
    # truncated IS: 12.18 -> 2.0, the others unchanged
    torch.testing.assert_close(weights, torch.tensor([[RATIOS[0], 2.0, RATIOS[2]]]))
    assert torch.equal(mask, MASK)
    weights, _, metrics = correct(rollout_is="token", rollout_is_threshold="0.5_5.0")
    # IcePop: 12.18 lies outside [0.5, 5] and is zeroed; 1 of 3 tokens out of bounds
    torch.testing.assert_close(weights, torch.tensor([[RATIOS[0], 0.0, RATIOS[2]]]))
    assert metrics["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(1 / 3)


def test_sequence_weight_is_the_product_of_token_ratios():
    weights, _, metrics = correct(rollout_is="sequence", rollout_is_threshold=10.0)
    # exp(-0.5 + 2.5 - 0.2) = exp(1.8) = 6.05 on every token
    torch.testing.assert_close(weights, torch.full((1, 3), math.exp(1.8)))
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(math.exp(1.8), rel=1e-5)


def test_rejection_by_token_and_by_sequence():
    # token_k1 keeps -x within [log(1/1.3), log(1.3)] = [-0.262, 0.262]: -x = [0.5, -2.5, 0.2] keeps token 2
    _, mask, metrics = correct(rollout_rs="token_k1", rollout_rs_threshold=1.3)
    assert mask.tolist() == [[0.0, 0.0, 1.0]]
    assert metrics["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(2 / 3)
    # seq_mean_k1: mean(-x) = -0.6 is outside the range, so the whole sequence goes
    assert correct(rollout_rs="seq_mean_k1", rollout_rs_threshold=1.3)[1].tolist() == [[0.0, 0.0, 0.0]]
    # seq_max_k2: max x^2 / 2 = 3.125 -> rejected under 1.0, kept under 4.0
    assert correct(rollout_rs="seq_max_k2", rollout_rs_threshold=1.0)[1].sum() == 0
    assert correct(rollout_rs="seq_max_k2", rollout_rs_threshold=4.0)[1].sum() == 3
    # several options must all pass
    assert correct(rollout_rs="seq_max_k2,token_k1", rollout_rs_threshold="4.0,1.3")[1].tolist() == [[0.0, 0.0, 1.0]]


def test_offpolicy_metrics():
    _, _, metrics = correct()
    assert metrics["rollout_corr/kl"] == pytest.approx((0.5 - 2.5 + 0.2) / 3)  # mean(-x)
    assert metrics["rollout_corr/training_ppl"] == pytest.approx(math.e)  # mean NLL 1
    assert metrics["rollout_corr/rollout_ppl"] == pytest.approx(math.exp((0.5 + 3.5 + 0.8) / 3))


def test_thresholds_and_config_are_checked():
    assert parse_is_threshold("0.5_5.0") == (5.0, 0.5) and parse_is_threshold(2) == (2.0, None)
    assert parse_rs_options("token_k1", 2.0) == {"token_k1": (0.5, 2.0)}
    with pytest.raises(ValueError, match="lower <= upper"):
        parse_is_threshold("3_1")
    with pytest.raises(ValueError, match="one upper bound"):
        parse_rs_options("token_k2", "0.5_2.0")
    with pytest.raises(ValueError, match="lower <= upper"):  # k1's lower is 1 / 0.5 = 2 > 0.5
        parse_rs_options("token_k1", 0.5)
    with pytest.raises(ValueError, match="needs rollout_rs_threshold"):
        correct(rollout_rs="token_k3")
    with pytest.raises(ValueError, match="rollout_is must be one of"):
        RolloutCorrectionConfig(rollout_is="tokens")
