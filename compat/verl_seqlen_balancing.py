"""verl's `verl.utils.seqlen_balancing` over hybridrl's, for code written against verl: the core's partition
functions, and `rearrange_micro_batches`, which splits a batch into the fewest micro-batches within a
token budget, with `get_reverse_idx` to restore the original order of their outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from hybridrl.data.seqlen_balancing import (  # noqa: F401 - verl's module holds these names
    ceildiv,
    get_seqlen_balanced_partitions,
    greedy_partition,
    karmarkar_karp,
    log_seqlen_unbalance,
)


def _attention_mask(batch: Any) -> torch.Tensor:
    tensors = batch.batch if hasattr(batch, "select_rows") else batch  # DataProto or a tensor mapping
    if "attention_mask" not in tensors:
        raise KeyError("rearrange_micro_batches needs an 'attention_mask' tensor in the batch")
    return tensors["attention_mask"]


def _select_rows(batch: Any, indices: list[int]) -> Any:
    """Rows of a DataProto, a TensorBatch, or a plain dict of tensors (same type back)."""
    if hasattr(batch, "select_rows"):
        return batch.select_rows(indices)
    if hasattr(batch, "rows"):
        return batch.rows(indices)
    index = torch.tensor(indices, dtype=torch.long)
    return {key: value[index] for key, value in batch.items()}


def _within_budget(seqlens: Sequence[int], k: int, max_token_len: int) -> list[list[int]] | None:
    """The k-way partition with the lighter heaviest part (KK or greedy) if it fits, else None."""
    if k > len(seqlens):
        return None
    candidates = [karmarkar_karp(seqlens, k, False), greedy_partition(seqlens, k, False)]
    heaviest = [max(sum(seqlens[i] for i in p) for p in parts) for parts in candidates]
    best = min(range(2), key=lambda c: heaviest[c])
    return sorted(candidates[best], key=lambda p: p[0]) if heaviest[best] <= max_token_len else None


def _fewest_micro_batches(
    seqlens: Sequence[int], start: int, step: int, max_token_len: int
) -> tuple[int, list[list[int]]]:
    """The smallest k >= start, in steps of `step`, with a partition whose every part is within budget."""
    k = start
    while (parts := _within_budget(seqlens, k, max_token_len)) is None:
        k += step
        if k > len(seqlens):
            raise ValueError(
                f"cannot split {len(seqlens)} sequences into a multiple of {step} micro-batches within "
                f"{max_token_len} tokens each; raise the token budget or the batch size"
            )
    return k, parts


def rearrange_micro_batches(
    batch: Any,
    max_token_len: int,
    dp_group: dist.ProcessGroup | None = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
) -> tuple[list[Any], list[list[int]]]:
    """Split `batch` into micro-batches of at most `max_token_len` real tokens (`attention_mask`) each.

    Their count starts at ceil(total / max_token_len) (at least `min_num_micro_batch`, a multiple of
    `num_batches_divided_by`) and grows until a balanced partition fits. With a `dp_group` and
    `same_micro_num_in_dp` every rank uses the largest count, as FSDP's collectives need.
    Returns (micro_batches, micro_bsz_idx): the row subsets and their original row indices.
    """
    seqlens = _attention_mask(batch).sum(dim=-1).tolist()  # (batch,) real tokens per row
    if max(seqlens) > max_token_len:
        raise ValueError(
            f"a sequence has {max(seqlens)} tokens, more than max_token_len={max_token_len}; raise "
            f"ppo_max_token_len_per_gpu (or log_prob_max_token_len_per_gpu) to at least prompt + response length"
        )
    step = num_batches_divided_by or 1
    start = max(ceildiv(sum(seqlens), max_token_len), min_num_micro_batch or 1)
    k, micro_bsz_idx = _fewest_micro_batches(seqlens, ceildiv(start, step) * step, step, max_token_len)
    if dp_group is not None and same_micro_num_in_dp:
        micro_bsz_idx = _agree_across_ranks(seqlens, k, step, max_token_len, dp_group)
    return [_select_rows(batch, idx) for idx in micro_bsz_idx], micro_bsz_idx


def _agree_across_ranks(
    seqlens: Sequence[int], k: int, step: int, max_token_len: int, group: dist.ProcessGroup
) -> list[list[int]]:
    """Raise k to the largest any rank needs, until that count fits on every rank (KK guarantees no
    monotonicity, so each round re-checks)."""
    while True:
        agreed = torch.tensor([k], dtype=torch.long)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
        k, parts = _fewest_micro_batches(seqlens, int(agreed.item()), step, max_token_len)
        needed = torch.tensor([k], dtype=torch.long)
        dist.all_reduce(needed, op=dist.ReduceOp.MAX, group=group)
        if int(needed.item()) == int(agreed.item()):
            return parts


def get_reverse_idx(idx_map: Sequence[int]) -> list[int]:
    """Inverse permutation: if outputs were produced in `idx_map` order, `outputs[reverse]` is original order."""
    reverse = [0] * len(idx_map)
    for position, original in enumerate(idx_map):
        reverse[original] = position
    return reverse
