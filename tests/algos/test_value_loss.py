"""Clipped value loss and the entropy bonus against hand-computed values."""


import pytest
import torch

from hybridrl.algos import compute_value_loss


def test_clipped_term_wins_when_the_prediction_moves_too_far():
    # values 1.0, clip 0.2 -> V_clip = 1.2; (1.5 - 2)^2 = 0.25 < (1.2 - 2)^2 = 0.64 -> 0.5 * 0.64 = 0.32
    vpreds = torch.tensor([[1.5]], requires_grad=True)
    loss, clipfrac = compute_value_loss(
        vpreds, torch.tensor([[2.0]]), torch.tensor([[1.0]]), torch.ones(1, 1), 0.2
    )
    assert loss.item() == pytest.approx(0.32)
    assert clipfrac.item() == 1.0
    loss.backward()
    assert vpreds.grad.item() == 0.0  # the clipped prediction does not depend on vpreds


def test_inside_the_clip_range_it_is_plain_squared_error():
    # (1.1 - 2)^2 = 0.81 for both terms -> 0.405; gradient (1.1 - 2) = -0.9 pushes the value up
    vpreds = torch.tensor([[1.1]], requires_grad=True)
    loss, clipfrac = compute_value_loss(
        vpreds, torch.tensor([[2.0]]), torch.tensor([[1.0]]), torch.ones(1, 1), 0.2
    )
    assert loss.item() == pytest.approx(0.405)
    assert clipfrac.item() == 0.0
    loss.backward()
    assert vpreds.grad.item() == pytest.approx(-0.9)


def test_masking_aggregation_and_bad_clip():
    vpreds = torch.tensor([[1.0, 3.0], [0.0, 50.0]])
    returns = torch.tensor([[2.0, 3.0], [1.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    # squared errors on valid tokens: 1, 0, 1 -> token-mean 2/3 -> 0.5 * 2/3 = 1/3
    loss, _ = compute_value_loss(vpreds, returns, vpreds, mask, cliprange_value=10.0)
    assert loss.item() == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="cliprange_value"):
        compute_value_loss(vpreds, returns, vpreds, mask, cliprange_value=-1.0)


def test_mini_batch_totals_normalise_a_micro_batch():
    vpreds = torch.tensor([[1.0, 3.0], [0.0, 50.0]])
    returns = torch.tensor([[2.0, 3.0], [1.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    # row 0 alone: squared errors 1 and 0 over the mini-batch's 3 tokens, on one of 2 ranks:
    # 0.5 * (1 + 0) / (3 / 2) = 1/3
    part, _ = compute_value_loss(vpreds[:1], returns[:1], vpreds[:1], mask[:1], 10.0, dp_size=2, batch_num_tokens=3)
    assert part.item() == pytest.approx(1 / 3)
