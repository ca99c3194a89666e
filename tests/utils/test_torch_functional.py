"""Masked statistics and logits helpers against hand-computed values and the textbook formulas."""

import math

import pytest
import torch

from hybridrl.utils.torch_functional import (
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)


def test_masked_mean_and_sum_hand_values():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    # (1 + 2) / 2 = 1.5 over the whole tensor; row 2 is fully masked
    assert masked_mean(values, mask).item() == pytest.approx(1.5)
    assert masked_sum(values, mask).item() == pytest.approx(3.0)
    # per row: [1.5, 0/0 -> 0 rather than NaN]
    torch.testing.assert_close(masked_mean(values, mask, axis=-1), torch.tensor([1.5, 0.0]))


def test_masked_slots_holding_nan_or_inf_do_not_leak():
    values = torch.tensor([[1.0, float("nan"), float("inf")]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 0.0]])
    out = masked_mean(values, mask)
    assert out.item() == 1.0
    out.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[1.0, 0.0, 0.0]]))


def test_masked_var_matches_bessel_corrected_variance():
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    # mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5; biased 5/4, unbiased 5/3
    assert masked_var(values, mask, unbiased=False).item() == pytest.approx(1.25)
    assert masked_var(values, mask).item() == pytest.approx(5 / 3)


def test_masked_var_needs_two_elements():
    values = torch.tensor([[1.0, 2.0]])
    with pytest.raises(ValueError, match="single element"):
        masked_var(values, torch.tensor([[1, 0]]))
    with pytest.raises(ValueError, match="no element"):
        masked_var(values, torch.tensor([[0, 0]]))


def test_masked_whiten_gives_zero_mean_unit_variance_on_valid_slots():
    torch.manual_seed(0)
    values = torch.randn(4, 6) * 3 + 7
    mask = (torch.rand(4, 6) > 0.3).int()
    out = masked_whiten(values, mask)
    assert masked_mean(out, mask).item() == pytest.approx(0.0, abs=1e-5)
    assert masked_var(out, mask).item() == pytest.approx(1.0, abs=1e-4)
    kept = masked_whiten(values, mask, shift_mean=False)
    assert masked_mean(kept, mask).item() == pytest.approx(masked_mean(values, mask).item(), abs=1e-4)


def test_entropy_hand_values():
    # uniform over 4 tokens: H = ln 4 = 1.3863; a near one-hot distribution: H ~ 0
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [50.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(
        entropy_from_logits(logits), torch.tensor([math.log(4), 0.0]), atol=1e-6, rtol=0
    )


@pytest.mark.parametrize("chunk_rows", [1, 3, 1024])
def test_entropy_matches_definition_and_chunking_is_invisible(chunk_rows):
    torch.manual_seed(1)
    logits = (torch.randn(2, 5, 11) * 4).requires_grad_(True)
    ref_logits = logits.detach().clone().requires_grad_(True)
    p = torch.softmax(ref_logits, -1)
    expected = -(p * torch.log(p)).sum(-1)  # H = -sum p log p, shape (2, 5)
    got = entropy_from_logits(logits, chunk_rows=chunk_rows)
    assert got.shape == (2, 5)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # backward through the checkpointed chunks equals backward through the plain formula
    weights = torch.randn(2, 5)
    (got * weights).sum().backward()
    (expected * weights).sum().backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad, atol=1e-5, rtol=1e-4)


def test_logprobs_hand_value():
    # logits [0, ln 3] -> softmax [1/4, 3/4]; log p(token 1) = ln 0.75 = -0.28768
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    labels = torch.tensor([[1]])
    assert logprobs_from_logits(logits, labels).item() == pytest.approx(math.log(0.75), abs=1e-6)


@pytest.mark.parametrize("chunk_rows", [1, 4, 1024])
def test_logprobs_match_log_softmax_with_gradients(chunk_rows):
    torch.manual_seed(2)
    logits = (torch.randn(3, 4, 17) * 5).requires_grad_(True)
    ref_logits = logits.detach().clone().requires_grad_(True)
    labels = torch.randint(0, 17, (3, 4))
    got = logprobs_from_logits(logits, labels, chunk_rows=chunk_rows)
    expected = torch.log_softmax(ref_logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    got.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad, atol=1e-5, rtol=1e-5)


def test_half_precision_inputs_are_reduced_in_fp32():
    torch.manual_seed(3)
    logits32 = torch.randn(2, 3, 50) * 6
    labels = torch.randint(0, 50, (2, 3))
    logits16 = logits32.bfloat16()
    exact = torch.log_softmax(logits16.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    got = logprobs_from_logits(logits16, labels)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, exact, atol=1e-5, rtol=1e-5)
    assert entropy_from_logits(logits16).dtype == torch.float32


def test_logprobs_reject_mismatched_labels():
    with pytest.raises(ValueError, match="labels shape"):
        logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def test_logits_helpers_compute_on_their_inputs_device():
    # on `meta` (shapes without data): a helper that made a CPU tensor would fail to mix it with the inputs
    # or return it, as it would with inputs on a GPU
    logits = torch.empty(2, 5, 7, device="meta")  # (batch, seq, vocab)
    labels = torch.empty(2, 5, dtype=torch.long, device="meta")
    mask = torch.empty(2, 5, device="meta")
    outputs = [logprobs_from_logits(logits, labels, chunk_rows=3), entropy_from_logits(logits, chunk_rows=3),
               masked_sum(labels.float(), mask), masked_mean(labels.float(), mask, axis=-1)]
    assert [t.device.type for t in outputs] == ["meta"] * 4
    assert [tuple(t.shape) for t in outputs] == [(2, 5), (2, 5), (), (2,)]
