"""Balancing sequences by token count across data-parallel ranks (verl's `verl.utils.seqlen_balancing` names
and arguments; its `rearrange_micro_batches` is in compat/verl_seqlen_balancing.py).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence


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
        merged = []
        for (sum_a, idx_a), (sum_b, idx_b) in zip(self.parts, reversed(other.parts), strict=True):
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
    """k non-empty partitions of sorted indices with near-equal token totals (`equal_size`: equal counts
    too), ordered by first index: `karmarkar_karp` or `greedy_partition`, the tighter."""
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
    return {
        f"{prefix}/min": min(naive),
        f"{prefix}/max": max(naive),
        f"{prefix}/minmax_diff": max(naive) - min(naive),
        f"{prefix}/balanced_min": min(balanced),
        f"{prefix}/balanced_max": max(balanced),
        f"{prefix}/mean": sum(seqlen_list) / k,
    }
