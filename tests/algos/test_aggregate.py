"""agg_loss: every mode against its formula on a ragged mask, plus micro-batch normalisers."""

import pytest
import torch

from hybridrl.algos import agg_loss

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])  # ragged: 2 and 1 valid tokens


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("token-sum", 7.0),  # 1 + 2 + 4
        ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2 sequences
        ("seq-mean-token-mean", 2.75),  # ((1 + 2) / 2 + 4 / 1) / 2 = (1.5 + 4) / 2
        ("seq-mean-token-sum-norm", 7 / 6),  # (3 / 3 + 4 / 3) / 2, L = padded length 3
    ],
)
def test_modes_match_formulas_on_ragged_mask(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_dr_grpo_constant_normaliser_can_be_fixed():
    # (3 / 7 + 4 / 7) / 2 = 0.5 with MAX_TOKENS = 7 independent of this batch's padding
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=7).item() == pytest.approx(0.5)


def test_all_masked_row_is_finite_and_counts_as_a_sequence():
    loss = torch.cat([LOSS, torch.tensor([[100.0, float("nan"), 100.0]])])
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=torch.long)])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(7 / 3)
    # (1.5 + 4 + 0) / 3 rows
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(5.5 / 3)
    for mode in ("token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        assert torch.isfinite(agg_loss(loss, mask, mode))
    assert agg_loss(loss, torch.zeros_like(mask), "token-mean").item() == 0.0


def test_micro_batches_with_global_normalisers_sum_to_the_full_batch_loss():
    for mode, kwargs in [
        ("token-mean", {"batch_num_tokens": 3}),
        ("seq-mean-token-mean", {"global_batch_size": 2}),
        ("seq-mean-token-sum", {"global_batch_size": 2}),
    ]:
        parts = [agg_loss(LOSS[i : i + 1], MASK[i : i + 1], mode, **kwargs) for i in range(2)]
        assert (parts[0] + parts[1]).item() == pytest.approx(agg_loss(LOSS, MASK, mode).item())


def test_dp_ranks_averaging_their_losses_recover_the_full_batch_loss():
    # rank r holds row r; gradients are averaged over 2 ranks, so each loss is scaled by dp_size:
    # rank0: 3 / (3 / 2) = 2, rank1: 4 / 1.5 = 2.667, average 2.333 = 7 / 3
    ranks = [
        agg_loss(LOSS[i : i + 1], MASK[i : i + 1], "token-mean", batch_num_tokens=3, dp_size=2)
        for i in range(2)
    ]
    assert ((ranks[0] + ranks[1]) / 2).item() == pytest.approx(7 / 3)


def test_token_sum_scales_by_dp_size_so_the_rank_average_is_the_global_sum():
    # rank r holds row r: rank0 sums 1 + 2 = 3, rank1 sums 4; times dp_size 2 -> 6 and 8, average 7 = 1 + 2 + 4
    ranks = [agg_loss(LOSS[i : i + 1], MASK[i : i + 1], "token-sum", dp_size=2) for i in range(2)]
    assert [r.item() for r in ranks] == [6.0, 8.0]
    assert ((ranks[0] + ranks[1]) / 2).item() == pytest.approx(agg_loss(LOSS, MASK, "token-sum").item())


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_mean_modes_across_ranks_need_the_global_count(mode):
    with pytest.raises(ValueError, match="dp_size=2 needs"):
        agg_loss(LOSS, MASK, mode, dp_size=2)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(KeyError, match="seq-mean-token-mean"):
        agg_loss(LOSS, MASK, "seq-mean")
    with pytest.raises(ValueError, match="shape"):
        agg_loss(LOSS, MASK[:, :2], "token-mean")


def test_gradient_flows_only_to_valid_tokens():
    loss = LOSS.clone().requires_grad_(True)
    agg_loss(loss, MASK, "token-mean").backward()
    torch.testing.assert_close(loss.grad, MASK.float() / 3)
