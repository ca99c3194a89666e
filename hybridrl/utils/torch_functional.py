"""Masked statistics, and the per-token log-probability and entropy of logits (verl's names)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

# Logit rows processed at once: one chunk's temporaries instead of a full (batch * seq, vocab) copy.
DEFAULT_CHUNK_ROWS = 256


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """sum_i mask_i * values_i over `axis` (all elements when None); masked-out slots count 0 even when they
    hold NaN or inf (padding after EOS often does)."""
    weighted = torch.where(mask != 0, values * mask, values.new_zeros(()))
    return weighted.sum() if axis is None else weighted.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """sum(mask * values) / sum(mask); a fully masked slice gives 0 instead of 0/0 = NaN."""
    denom = mask.sum() if axis is None else mask.sum(dim=axis)
    # clamp rather than add an epsilon so means over real tokens stay exact
    return masked_sum(values, mask, axis) / denom.to(values.dtype).clamp(min=1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked elements, with Bessel's correction when `unbiased` (raises for fewer than 2)."""
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count == 0:
            raise ValueError("masked_var: the mask selects no element; at least 2 are needed for a variance")
        if count == 1:
            raise ValueError(
                "masked_var: the mask selects a single element, so the unbiased variance divides by zero; "
                "use a larger batch (e.g. more responses per step) or unbiased=False"
            )
        variance = variance * (count / (count - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / sqrt(var + 1e-8) over the masked elements; adds the mean back if not `shift_mean`."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor, tensor_max: torch.Tensor) -> torch.Tensor:
    """Element-wise clamp of `x` into [tensor_min, tensor_max] where the bounds are tensors."""
    return torch.max(torch.min(x, tensor_max), tensor_min)


def _rowwise_chunked(
    fn: Callable[[torch.Tensor], torch.Tensor], rows: torch.Tensor, chunk_rows: int
) -> torch.Tensor:
    """Apply a row reduction `fn` ((n, vocab) -> (n,)) chunk by chunk; under autograd each chunk is
    checkpointed, so backward recomputes its softmax instead of keeping every chunk's temporaries."""
    if chunk_rows <= 0:
        raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
    track_grad = torch.is_grad_enabled() and rows.requires_grad
    outs = [checkpoint(fn, chunk, use_reentrant=False) if track_grad else fn(chunk)
            for chunk in rows.split(chunk_rows, dim=0)]
    if not outs:  # zero rows
        return rows.new_zeros((0,), dtype=torch.promote_types(rows.dtype, torch.float32))
    return torch.cat(outs, dim=0)


def _entropy_rows(logits: torch.Tensor) -> torch.Tensor:
    # H = logsumexp(z) - sum_v softmax(z)_v * z_v, computed in fp32 for bf16/fp16 inputs
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    probs = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - (probs * z).sum(dim=-1)


def entropy_from_logits(logits: torch.Tensor, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> torch.Tensor:
    """Entropy of softmax over the last dim, chunked: (..., vocab) -> (...), fp32 for half-precision input."""
    rows = logits.reshape(-1, logits.shape[-1])  # (n_rows, vocab)
    return _rowwise_chunked(_entropy_rows, rows, chunk_rows).reshape(logits.shape[:-1])


def _logsumexp_rows(logits: torch.Tensor) -> torch.Tensor:
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return torch.logsumexp(z, dim=-1)


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, chunk_rows: int = DEFAULT_CHUNK_ROWS
) -> torch.Tensor:
    """log softmax(logits)[label] = z_y - logsumexp(z), chunked, without a log-softmax copy: logits
    (..., vocab), labels (...) -> (...); fp32 for half-precision input (PPO ratios need it)."""
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"logprobs_from_logits: labels shape {tuple(labels.shape)} must equal logits shape without "
            f"the vocab dim {tuple(logits.shape[:-1])}"
        )
    rows = logits.reshape(-1, logits.shape[-1])  # (n_rows, vocab)
    flat_labels = labels.reshape(-1, 1).long()  # (n_rows, 1)
    label_logits = rows.gather(-1, flat_labels).squeeze(-1)  # (n_rows,)
    lse = _rowwise_chunked(_logsumexp_rows, rows, chunk_rows)  # (n_rows,)
    return (label_logits.to(lse.dtype) - lse).reshape(labels.shape)
