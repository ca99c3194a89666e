"""Micro-batches that waste as little compute on padding as possible.

On CPU (and without flash-attention's variable-length kernels) a forward pass costs rows x width, so
padding columns are paid for. Two things keep that small, for the actor, critic and reference alike:

1. Rows are sorted by their real length before they are cut into micro-batches, so each micro-batch
   holds sequences of similar length.
2. Each micro-batch is trimmed to the columns where at least one row has a real token: leading columns
   that are left-padding in every row and trailing columns that are right-padding in every row go.

Every rank of an FSDP group must run the same number of forward passes (each one all-gathers the
parameters), so the number of micro-batches is agreed across ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from hybridrl.protocol import DataProto


@dataclass
class MicroBatch:
    data: DataProto
    indices: list[int]  # rows of the parent batch, in the order they appear in `data`


def _agree_max(value: int) -> int:
    if dist.is_initialized() and dist.get_world_size() > 1:
        t = torch.tensor([value], dtype=torch.long)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())
    return value


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


def make_micro_batches(
    data: DataProto,
    micro_batch_size: int | None = None,
    max_token_len: int | None = None,
) -> list[MicroBatch]:
    """Cut `data` into micro-batches of similar-length rows.

    Fixed size (`micro_batch_size` rows) or dynamic (`max_token_len`: rows x padded width of each
    micro-batch stays within the budget, which is what a padded forward pass costs). The count is the
    same on every rank of the process group; a rank with too few rows runs dummy micro-batches (a real
    row with its response masked out) whose outputs are dropped.
    """
    if (micro_batch_size is None) == (max_token_len is None):
        raise ValueError("give exactly one of micro_batch_size (fixed) or max_token_len (dynamic batch size)")
    lengths = data.batch["attention_mask"].sum(dim=-1).tolist()
    order = sorted(range(len(data)), key=lambda i: lengths[i])
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
        groups, current = [], []
        for i in order:  # ascending length: the newest row is the widest of its group
            if current and (len(current) + 1) * lengths[i] > max_token_len:
                groups.append(current)
                current = []
            current.append(i)
        groups.append(current)
    groups = [g for g in groups if g]
    count = _agree_max(len(groups))
    micro = [MicroBatch(data.select_rows(g), g) for g in _split_to_count(groups, count)]
    while len(micro) < count:  # too few rows here to match the other ranks' forward passes
        micro.append(_dummy(data))
    return micro


def _dummy(data: DataProto) -> MicroBatch:
    """One real row with its response masked out: runs the collectives, contributes nothing."""
    row = data.select_rows([0]).select(deepcopy=True)
    if "response_mask" in row.batch:
        row.batch["response_mask"] = torch.zeros_like(row.batch["response_mask"])
    return MicroBatch(row, [])


def restore_order(parts: list[torch.Tensor], micro_batches: list[MicroBatch], total: int) -> torch.Tensor:
    """Scatter per-micro-batch outputs back into the parent batch's row order."""
    nonempty = [(p, mb) for p, mb in zip(parts, micro_batches, strict=True) if mb.indices]
    stacked = torch.cat([p for p, _ in nonempty], dim=0)
    index = torch.tensor([i for _, mb in nonempty for i in mb.indices], dtype=torch.long)
    out = torch.empty((total, *stacked.shape[1:]), dtype=stacked.dtype)
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
    first = int(used[0]) if used.numel() else prompt_len
    last = int(used[-1]) if used.numel() else prompt_len - 1
    first = min(first, prompt_len - 1)  # keep the last prompt column: it predicts the first response token
    last = max(last, prompt_len - 1)
    cols = slice(first, last + 1)
    return TrimmedInputs(
        input_ids=data.batch["input_ids"][:, cols],
        attention_mask=mask[:, cols],
        position_ids=data.batch["position_ids"][:, cols],
        response_start=prompt_len - first,
        response_kept=last + 1 - prompt_len,
    )
