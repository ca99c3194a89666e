"""Micro-batches that waste little compute on padding: rows sorted by real length before they are cut,
columns that are padding in every row dropped; the count agreed across the ranks, whose forwards all-gather."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hybridrl.protocol import DataProto


@dataclass
class MicroBatch:
    data: DataProto
    indices: list[int]  # rows of the parent batch, in the order they appear in `data`


def reduce_over_ranks(values: list, op: Any = dist.ReduceOp.SUM,
                      dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, int]:
    """`values` reduced over all ranks on the CPU (where gloo reduces), and the number of ranks."""
    totals = torch.tensor(values, dtype=dtype, device="cpu")
    if not (dist.is_initialized() and dist.get_world_size() > 1 and totals.numel()):
        return totals, 1
    dist.all_reduce(totals, op=op)
    return totals, dist.get_world_size()


def _split_to_count(groups: list[list[int]], count: int) -> list[list[int]]:
    """Split the largest groups in two until there are `count` groups (each keeps >= 1 row)."""
    groups = [g for g in groups if g]
    while len(groups) < count:
        largest = max(range(len(groups)), key=lambda i: len(groups[i]))
        if len(groups[largest]) < 2:
            break  # fewer rows than micro-batches: ranks with spare passes run empty ones
        g = groups.pop(largest)
        groups[largest:largest] = [g[: len(g) // 2], g[len(g) // 2:]]
    return groups


def cheapest_cuts(sorted_lengths: list[int], max_token_len: int) -> list[tuple[int, int]]:
    """Cut ascending lengths into contiguous runs [lo, hi) whose padded passes cost least in all (exact, by
    dynamic programming): a run costs (rows + 1) x its longest length (the extra row: a pass's fixed cost)
    and keeps rows x longest within `max_token_len` (a longer row runs alone)."""
    n = len(sorted_lengths)
    best = [0] + [float("inf")] * n  # best[i]: cheapest cost of the first i rows
    start = [0] * (n + 1)  # start[i]: where the last run of that cheapest cut begins
    for hi in range(1, n + 1):
        width = max(sorted_lengths[hi - 1], 1)
        fits = max(max_token_len // width, 1)  # rows of this width a pass can take
        for lo in range(max(hi - fits, 0), hi):
            cost = best[lo] + (hi - lo + 1) * width
            if cost < best[hi]:
                best[hi], start[hi] = cost, lo
    cuts, hi = [], n
    while hi > 0:
        cuts.append((start[hi], hi))
        hi = start[hi]
    return cuts[::-1]


def make_micro_batches(data: DataProto, micro_batch_size: int | None = None, max_token_len: int | None = None,
                       group_ids: torch.Tensor | None = None) -> list[MicroBatch]:
    """Cut `data` into micro-batches of similar-length rows: `micro_batch_size` rows each, or within a
    `max_token_len` budget of rows x padded width. Rows with equal `group_ids` stay together; a rank with too
    few rows for the agreed count runs dummy micro-batches whose outputs are dropped."""
    if (micro_batch_size is None) == (max_token_len is None):
        raise ValueError("give exactly one of micro_batch_size (fixed) or max_token_len (dynamic batch size)")
    lengths = data.batch["attention_mask"].sum(dim=-1).tolist()
    if group_ids is None:
        order = sorted(range(len(data)), key=lambda i: lengths[i])
    else:
        group_of = group_ids.tolist()
        longest: dict[int, int] = {}
        for group, length in zip(group_of, lengths, strict=True):
            longest[group] = max(longest.get(group, 0), length)
        order = sorted(range(len(data)), key=lambda i: (longest[group_of[i]], group_of[i], lengths[i]))
    if micro_batch_size is not None:
        if micro_batch_size <= 0:
            raise ValueError(f"micro batch size must be positive, got {micro_batch_size}")
        groups = [order[i:i + micro_batch_size] for i in range(0, len(order), micro_batch_size)]
    else:
        width = data.batch["attention_mask"].shape[-1]
        if max_token_len < width:
            raise ValueError(
                f"max_token_len={max_token_len} is below one padded sequence ({width} tokens = prompt + response "
                f"length); raise ppo_max_token_len_per_gpu / log_prob_max_token_len_per_gpu"
            )
        sorted_lengths = [lengths[i] for i in order]
        groups = [order[lo:hi] for lo, hi in cheapest_cuts(sorted_lengths, max_token_len)]
    count = int(reduce_over_ranks([len([g for g in groups if g])], dist.ReduceOp.MAX, torch.long)[0][0])
    micro = [MicroBatch(data.select_rows(g), g) for g in _split_to_count(groups, count)]
    micro += [_dummy(data) for _ in range(count - len(micro))]  # too few rows here for the other ranks' count
    return micro


def _dummy(data: DataProto) -> MicroBatch:
    """One real row with its loss masked out: runs the collectives, contributes nothing."""
    row = data.select_rows([0]).select(deepcopy=True)
    for key in ("response_mask", "loss_mask"):  # what the PPO and the SFT losses count
        if key in row.batch:
            row.batch[key] = torch.zeros_like(row.batch[key])
    return MicroBatch(row, [])


def restore_order(parts: list[torch.Tensor], micro_batches: list[MicroBatch], total: int) -> torch.Tensor:
    """Scatter per-micro-batch outputs back into the parent batch's row order."""
    nonempty = [(p, mb) for p, mb in zip(parts, micro_batches, strict=True) if mb.indices]
    stacked = torch.cat([p for p, _ in nonempty], dim=0)  # (rows, ...)
    index = torch.tensor([i for _, mb in nonempty for i in mb.indices], dtype=torch.long, device=stacked.device)
    out = torch.empty((total, *stacked.shape[1:]), dtype=stacked.dtype, device=stacked.device)
    out[index] = stacked
    return out


@dataclass
class TrimmedInputs:
    input_ids: torch.Tensor  # (rows, kept_width)
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_start: int  # column of the first response token in the trimmed tensors
    response_kept: int  # response columns kept (trailing all-padding ones are dropped)


def trim_columns(data: DataProto, response_length: int) -> TrimmedInputs:
    """Drop columns that are padding in every row (left of the prompts, right of the responses)."""
    mask = data.batch["attention_mask"]  # (rows, prompt_len + response_len)
    width = mask.shape[-1]
    prompt_len = width - response_length
    used = mask.any(dim=0).nonzero().squeeze(-1)
    # keep the last prompt column either way: it predicts the first response token
    first = min(int(used[0]), prompt_len - 1) if used.numel() else prompt_len - 1
    last = max(int(used[-1]), prompt_len - 1) if used.numel() else prompt_len - 1
    cols = slice(first, last + 1)
    return TrimmedInputs(
        input_ids=data.batch["input_ids"][:, cols],
        attention_mask=mask[:, cols],
        position_ids=data.batch["position_ids"][:, cols],
        response_start=prompt_len - first,
        response_kept=last + 1 - prompt_len,
    )
