"""Balancing sequences by token count across data-parallel ranks and into micro-batches (verl's
`verl.utils.seqlen_balancing` names and arguments).

`get_seqlen_balanced_partitions` gives k index lists with near-equal token totals (`equal_size`: equal
counts too), the better of `karmarkar_karp` (the largest differencing method: Karmarkar & Karp 1982, k-way
by Korf, IJCAI 2009) and `greedy_partition`. `rearrange_micro_batches` splits a batch into the fewest
micro-batches within a token budget; `get_reverse_idx` restores the original order of their outputs.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist


def ceildiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_args(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> None:
    if k_partitions < 1:
        raise ValueError(f"k_partitions must be >= 1, got {k_partitions}")
    if len(seqlen_list) < k_partitions:
        raise ValueError(f"cannot split {len(seqlen_list)} sequences into {k_partitions} non-empty "
                         f"partitions")
    if equal_size and len(seqlen_list) % k_partitions:
        raise ValueError(f"equal_size needs the number of sequences ({len(seqlen_list)}) to be divisible by "
                         f"k_partitions ({k_partitions}); make the batch size a multiple of the "
                         f"data-parallel size")


class _Partial:
    """A partial k-way partition: parts kept sorted by total, heaviest first."""

    def __init__(self, parts: list[tuple[int, list[int]]]) -> None:
        self.parts = sorted(parts, key=lambda p: (-p[0], p[1]))

    @property
    def spread(self) -> int:
        return self.parts[0][0] - self.parts[-1][0]

    def merge(self, other: _Partial) -> _Partial:
        """Heaviest of self with lightest of other, and so on, so the spreads offset; reuses self's lists."""
        paired = zip(self.parts, reversed(other.parts), strict=True)
        merged = []
        for (sum_a, idx_a), (sum_b, idx_b) in paired:
            idx_a.extend(idx_b)
            merged.append((sum_a + sum_b, idx_a))
        return _Partial(merged)


def karmarkar_karp(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """k index lists with near-equal sums: partial partitions in a max-heap by spread, the two widest merged
    until one is left. Each starts as one sequence, or with `equal_size` as k consecutive sorted ones."""
    _check_args(seqlen_list, k_partitions, equal_size)
    order = sorted(range(len(seqlen_list)), key=lambda i: (seqlen_list[i], i))
    if equal_size:
        groups = [order[s : s + k_partitions] for s in range(0, len(order), k_partitions)]
        partials = [_Partial([(seqlen_list[i], [i]) for i in g]) for g in groups]
    else:
        partials = [_Partial([(seqlen_list[i], [i])] + [(0, []) for _ in range(k_partitions - 1)])
                    for i in order]
    tiebreak = itertools.count()  # equal spreads pop in insertion order, so results are deterministic
    heap = [(-p.spread, next(tiebreak), p) for p in partials]
    heapq.heapify(heap)
    while len(heap) > 1:
        a = heapq.heappop(heap)[2]
        b = heapq.heappop(heap)[2]
        merged = a.merge(b)
        heapq.heappush(heap, (-merged.spread, next(tiebreak), merged))
    return [sorted(indices) for _, indices in heap[0][2].parts]


def greedy_partition(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Longest-first greedy: each sequence joins the lightest part with room (n/k with `equal_size`)."""
    _check_args(seqlen_list, k_partitions, equal_size)
    capacity = len(seqlen_list) // k_partitions if equal_size else len(seqlen_list)
    sums = [0] * k_partitions
    parts: list[list[int]] = [[] for _ in range(k_partitions)]
    for i in sorted(range(len(seqlen_list)), key=lambda i: (-seqlen_list[i], i)):
        j = min((j for j in range(k_partitions) if len(parts[j]) < capacity), key=lambda j: (sums[j], j))
        parts[j].append(i)
        sums[j] += seqlen_list[i]
    return [sorted(p) for p in parts]


def _spread(seqlen_list: Sequence[int], partitions: Sequence[Sequence[int]]) -> int:
    sums = [sum(seqlen_list[i] for i in p) for p in partitions]
    return max(sums) - min(sums)


def get_seqlen_balanced_partitions(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool
                                   ) -> list[list[int]]:
    """Balanced non-empty partitions of sorted indices, ordered by first index: KK or greedy, the tighter."""
    candidates = [karmarkar_karp(seqlen_list, k_partitions, equal_size),
                  greedy_partition(seqlen_list, k_partitions, equal_size)]
    partitions = min(candidates, key=lambda p: _spread(seqlen_list, p))  # KK on ties
    seen = sorted(i for p in partitions for i in p)
    if seen != list(range(len(seqlen_list))) or any(not p for p in partitions):
        raise AssertionError(f"partitioning lost or repeated an index: {partitions}")
    return sorted(partitions, key=lambda p: p[0])


def log_seqlen_unbalance(seqlen_list: Sequence[int], partitions: Sequence[Sequence[int]],
                         prefix: str) -> dict:
    """Token totals of a naive contiguous equal-count split (min/max/minmax_diff, as verl reports them)
    next to the balanced partitions' (balanced_min/balanced_max), and the mean per partition."""
    k = len(partitions)
    chunk = ceildiv(len(seqlen_list), k)
    naive = [sum(seqlen_list[s : s + chunk]) for s in range(0, len(seqlen_list), chunk)]
    balanced = [sum(seqlen_list[i] for i in p) for p in partitions]
    return {f"{prefix}/min": min(naive), f"{prefix}/max": max(naive),
            f"{prefix}/minmax_diff": max(naive) - min(naive), f"{prefix}/balanced_min": min(balanced),
            f"{prefix}/balanced_max": max(balanced), f"{prefix}/mean": sum(seqlen_list) / k}


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


def _fewest_micro_batches(seqlens: Sequence[int], start: int, step: int, max_token_len: int
                          ) -> tuple[int, list[list[int]]]:
    """The smallest k >= start, in steps of `step`, with a partition whose every part is within budget."""
    k = start
    while (parts := _within_budget(seqlens, k, max_token_len)) is None:
        k += step
        if k > len(seqlens):
            raise ValueError(f"cannot split {len(seqlens)} sequences into a multiple of {step} micro-batches "
                             f"within {max_token_len} tokens each; raise the token budget or the batch size")
    return k, parts


def rearrange_micro_batches(batch: Any, max_token_len: int, dp_group: dist.ProcessGroup | None = None,
                            num_batches_divided_by: int | None = None, same_micro_num_in_dp: bool = True,
                            min_num_micro_batch: int | None = None) -> tuple[list[Any], list[list[int]]]:
    """Split `batch` into micro-batches of at most `max_token_len` real tokens (`attention_mask`) each.

    Their count starts at ceil(total / max_token_len) (at least `min_num_micro_batch`, a multiple of
    `num_batches_divided_by`) and grows until a balanced partition fits. With a `dp_group` and
    `same_micro_num_in_dp` every rank uses the largest count, as FSDP's collectives need.
    Returns (micro_batches, micro_bsz_idx): the row subsets and their original row indices.
    """
    seqlens = _attention_mask(batch).sum(dim=-1).tolist()  # (batch,) real tokens per row
    if max(seqlens) > max_token_len:
        raise ValueError(f"a sequence has {max(seqlens)} tokens, more than max_token_len={max_token_len}; "
                         f"raise ppo_max_token_len_per_gpu (or log_prob_max_token_len_per_gpu) to at least "
                         f"prompt + response length")
    step = num_batches_divided_by or 1
    start = max(ceildiv(sum(seqlens), max_token_len), min_num_micro_batch or 1)
    k, micro_bsz_idx = _fewest_micro_batches(seqlens, ceildiv(start, step) * step, step, max_token_len)
    if dp_group is not None and same_micro_num_in_dp:
        micro_bsz_idx = _agree_across_ranks(seqlens, k, step, max_token_len, dp_group)
    return [_select_rows(batch, idx) for idx in micro_bsz_idx], micro_bsz_idx


def _agree_across_ranks(seqlens: Sequence[int], k: int, step: int, max_token_len: int,
                        group: dist.ProcessGroup) -> list[list[int]]:
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
    """Inverse permutation: if outputs came in `idx_map` order, `outputs[reverse]` is the original order."""
    reverse = [0] * len(idx_map)
    for position, original in enumerate(idx_map):
        reverse[original] = position
    return reverse
