"""Reducing per-token losses (batch, response_len) to the back-propagated scalar, by registered mode name.

The choice sets the length bias (Dr. GRPO, https://arxiv.org/abs/2503.20783; DAPO,
https://arxiv.org/abs/2503.14476). With l_it, m_it the loss and mask of token t of sequence i, B the
sequences and L the padded response length:

    token-mean               sum_it m_it l_it / sum_it m_it           (DAPO: every token weighs the same)
    token-sum                sum_it m_it l_it                         (times dp_size, see AggNormalizers)
    seq-mean-token-sum       (1/B) sum_i sum_t m_it l_it
    seq-mean-token-mean      (1/B) sum_i (sum_t m_it l_it / sum_t m_it) (original GRPO)
    seq-mean-token-sum-norm  (1/B) sum_i sum_t m_it l_it / L          (Dr. GRPO: constant normaliser)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hybridrl.utils.registry import Registry
from hybridrl.utils.torch_functional import masked_sum


@dataclass(frozen=True)
class AggNormalizers:
    """The mini-batch's totals, so micro-batch (and per-rank) losses add up to the mini-batch loss.

    batch_num_tokens: its valid tokens (token-mean); global_batch_size: its sequences (seq-mean-*); None
    uses the tensor's own count, which dp_size > 1 refuses. dp_size: ranks, whose gradient average the loss
    is multiplied back for. loss_scale_factor: L of seq-mean-token-sum-norm (default: the padded length).
    """

    batch_num_tokens: float | torch.Tensor | None = None
    global_batch_size: float | torch.Tensor | None = None
    dp_size: int = 1
    loss_scale_factor: float | None = None


AggFn = Callable[[torch.Tensor, torch.Tensor, AggNormalizers], torch.Tensor]
LOSS_AGG_REGISTRY: Registry[AggFn] = Registry("loss_agg_mode")


def register_loss_agg_mode(name: str) -> Callable[[AggFn], AggFn]:
    """Decorator registering `fn(loss_mat, loss_mask, normalizers) -> scalar` under `name`."""
    return LOSS_AGG_REGISTRY.register(name)


def _seq_denominator(loss_mat: torch.Tensor, norm: AggNormalizers) -> float | torch.Tensor:
    # a fully masked row counts as a sequence (verl 0.9 drops it when no global_batch_size is given)
    if norm.global_batch_size is not None:
        return norm.global_batch_size / norm.dp_size
    _require_global_count(norm, "global_batch_size")
    return loss_mat.shape[0]


def _require_global_count(norm: AggNormalizers, name: str) -> None:
    """A local count is right on one rank only; across ranks it would mis-scale the loss."""
    if norm.dp_size > 1:
        raise ValueError(f"agg_loss: dp_size={norm.dp_size} needs the mini-batch's {name} over all ranks")


@register_loss_agg_mode("token-mean")
def _token_mean(loss_mat: torch.Tensor, loss_mask: torch.Tensor, norm: AggNormalizers) -> torch.Tensor:
    total = masked_sum(loss_mat, loss_mask)
    if norm.batch_num_tokens is None:
        _require_global_count(norm, "batch_num_tokens")
        n_tokens = loss_mask.sum().to(loss_mat.dtype)
    else:
        n_tokens = torch.as_tensor(norm.batch_num_tokens, dtype=loss_mat.dtype, device=loss_mat.device)
        n_tokens = n_tokens / norm.dp_size
    return total / n_tokens.clamp(min=1e-8)  # all-masked batch: 0, not NaN


@register_loss_agg_mode("token-sum")
def _token_sum(loss_mat: torch.Tensor, loss_mask: torch.Tensor, norm: AggNormalizers) -> torch.Tensor:
    # times dp_size: the ranks' gradient average is then the sum over the whole mini-batch
    return masked_sum(loss_mat, loss_mask) * norm.dp_size


@register_loss_agg_mode("seq-mean-token-sum")
def _seq_mean_token_sum(
    loss_mat: torch.Tensor, loss_mask: torch.Tensor, norm: AggNormalizers
) -> torch.Tensor:
    seq_losses = masked_sum(loss_mat, loss_mask, axis=-1)  # (batch,)
    return seq_losses.sum() / _seq_denominator(loss_mat, norm)


@register_loss_agg_mode("seq-mean-token-mean")
def _seq_mean_token_mean(
    loss_mat: torch.Tensor, loss_mask: torch.Tensor, norm: AggNormalizers
) -> torch.Tensor:
    counts = loss_mask.sum(dim=-1).to(loss_mat.dtype).clamp(min=1e-8)  # (batch,); empty row -> 0/eps = 0
    seq_losses = masked_sum(loss_mat, loss_mask, axis=-1) / counts  # (batch,)
    return seq_losses.sum() / _seq_denominator(loss_mat, norm)


@register_loss_agg_mode("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(
    loss_mat: torch.Tensor, loss_mask: torch.Tensor, norm: AggNormalizers
) -> torch.Tensor:
    # Dr. GRPO's constant normaliser; the padded length unless the caller fixes it
    scale = loss_mask.shape[-1] if norm.loss_scale_factor is None else norm.loss_scale_factor
    seq_losses = masked_sum(loss_mat, loss_mask, axis=-1) / scale  # (batch,)
    return seq_losses.sum() / _seq_denominator(loss_mat, norm)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    batch_num_tokens: float | torch.Tensor | None = None,
    global_batch_size: float | torch.Tensor | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate per-token losses (batch, response_len) into a scalar; the keywords are `AggNormalizers`."""
    if loss_mat.shape != loss_mask.shape:
        raise ValueError(
            f"agg_loss: loss_mat shape {tuple(loss_mat.shape)} != loss_mask shape {tuple(loss_mask.shape)}"
        )
    if dp_size < 1:
        raise ValueError(f"agg_loss: dp_size must be >= 1, got {dp_size}")
    fn = LOSS_AGG_REGISTRY.get(loss_agg_mode)
    norm = AggNormalizers(batch_num_tokens, global_batch_size, dp_size, loss_scale_factor)
    return fn(loss_mat, loss_mask, norm)
