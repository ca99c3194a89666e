"""Reducing a (batch, response_len) matrix of per-token losses to the scalar that is back-propagated.

The choice matters for length bias (Dr. GRPO, Liu et al. 2025, https://arxiv.org/abs/2503.20783;
DAPO, Yu et al. 2025, https://arxiv.org/abs/2503.14476). With l_it the loss of token t of sequence i,
m_it its mask, B the number of sequences and L the padded response length:

    token-mean               sum_it m_it l_it / sum_it m_it           (DAPO: every token weighs the same)
    token-sum                sum_it m_it l_it                         (times dp_size, see AggNormalizers)
    seq-mean-token-sum       (1/B) sum_i sum_t m_it l_it
    seq-mean-token-mean      (1/B) sum_i (sum_t m_it l_it / sum_t m_it) (original GRPO)
    seq-mean-token-sum-norm  (1/B) sum_i sum_t m_it l_it / L          (Dr. GRPO: constant normaliser)

Each mode is registered by name, so a user can add one with `register_loss_agg_mode`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hybridrl.utils.registry import Registry
from hybridrl.utils.torch_functional import masked_sum


@dataclass(frozen=True)
class AggNormalizers:
    """Global counts that keep micro-batched gradients equal to one big batch's.

    When a mini-batch is split into micro-batches (and data-parallel ranks), each piece must divide by
    the mini-batch's totals, not its own. None means "use this tensor's own count".

    batch_num_tokens: valid tokens in the whole mini-batch (token-mean).
    global_batch_size: sequences in the whole mini-batch (seq-mean-*).
    dp_size: data-parallel ranks; gradients are averaged over ranks, so the loss is multiplied back.
        With dp_size > 1 the mean modes need their global count (a local one would mis-scale them).
    loss_scale_factor: the constant L of seq-mean-token-sum-norm (default: the padded length).
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
    # A fully masked row still counts as a sequence of the batch (it contributes 0). verl 0.9 leaves
    # such rows out of the count when no global_batch_size is given; with it (the trainer's path) the
    # two agree.
    if norm.global_batch_size is not None:
        return norm.global_batch_size / norm.dp_size
    _require_global_count(norm, "global_batch_size")
    return loss_mat.shape[0]


def _require_global_count(norm: AggNormalizers, name: str) -> None:
    """A local count is only right on a single rank; across ranks it would silently mis-scale the loss."""
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
    # data-parallel training averages gradients over ranks; scaling each rank's sum by dp_size makes
    # that average the sum over every token of the mini-batch, as on one rank
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
    # Dr. GRPO divides by a constant (MAX_TOKENS) rather than each response's length, removing the
    # bias toward long wrong answers; the padded length stands in unless the caller fixes it.
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
    """Aggregate per-token losses (batch, response_len) into a scalar; see the module docstring.

    The keyword normalisers are for micro-batching: pass the mini-batch's token / sequence totals so
    the sum of micro-batch losses equals the mini-batch loss (see `AggNormalizers`).
    """
    if loss_mat.shape != loss_mask.shape:
        raise ValueError(
            f"agg_loss: loss_mat shape {tuple(loss_mat.shape)} != loss_mask shape {tuple(loss_mask.shape)}"
        )
    if dp_size < 1:
        raise ValueError(f"agg_loss: dp_size must be >= 1, got {dp_size}")
    fn = LOSS_AGG_REGISTRY.get(loss_agg_mode)
    norm = AggNormalizers(batch_num_tokens, global_batch_size, dp_size, loss_scale_factor)
    return fn(loss_mat, loss_mask, norm)
