"""Ulysses sequence parallelism (DeepSpeed-Ulysses, arXiv:2309.14509) for the actor, reference, critic
and SFT passes: a group of `size` consecutive ranks runs each pass together, each rank on 1/size of every
sequence's columns, with an all-to-all around attention trading columns for heads. The data flow and why
the gradients are exact: docs/sequence-parallel.md.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface

from hybridrl.controller.worker import collective_timeout
from hybridrl.models.attention import (
    GROUPED_EAGER,
    additive,
    attention_mode,
    earlier_real_keys,
    grouped_eager_attention,
    head_on_kept_positions,
    own_attention,
)
from hybridrl.protocol import DataProto
from hybridrl.tensor_batch import TensorBatch
from hybridrl.utils.typed_config import ConfigError

ULYSSES = "hybridrl_ulysses"
LAYOUT_KWARG = "ulysses_layout"
# attentions whose arithmetic the sequence-parallel attention reproduces: sdpa's, or eager's (grouped_eager)
BASE_ATTENTION = {"sdpa": "sdpa", "eager": GROUPED_EAGER, GROUPED_EAGER: GROUPED_EAGER}


def _all_to_all(x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    size = dist.get_world_size(group)
    parts = [p.contiguous() for p in x.chunk(size, dim=scatter_dim)]
    received = [torch.empty_like(parts[0]) for _ in range(size)]
    dist.all_to_all(received, parts, group=group)
    return torch.cat(received, dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """Scatter `scatter_dim` over the group, gather `gather_dim`; the backward is the reverse exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, ctx.group, gather_dim, scatter_dim), None, None, None


class _GatherColumns(torch.autograd.Function):
    """(rows, counts[rank], ...) per rank -> (rows, sum(counts), ...) on every rank, in rank order. Backward:
    this rank's columns of the gradient, with no exchange (every rank holds the same loss)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any, rank: int, counts: tuple[int, ...]) -> torch.Tensor:
        widest = max(counts)
        padded = F.pad(x, (0, 0) * (x.dim() - 2) + (0, widest - x.shape[1])).contiguous()
        parts = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(parts, padded, group=group)
        ctx.start, ctx.count = sum(counts[:rank]), counts[rank]
        return torch.cat([p[:, :n] for p, n in zip(parts, counts, strict=True)], dim=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad[:, ctx.start:ctx.start + ctx.count], None, None, None


class UlyssesLayout:
    """What every attention layer of one sequence-parallel forward reads: the group and the whole sequences'
    padding mask (rows, columns). Not a dataclass: FSDP's input casting would rebuild one for every layer."""

    def __init__(self, group: Any, size: int, attention_mask: torch.Tensor, base_attention: str) -> None:
        self.group, self.size = group, size
        self.real = attention_mask.bool()  # (rows, columns) 1 on real tokens
        self.base_attention = base_attention
        self.calls = 0  # attention layers that ran through the layout
        self._masks: dict[torch.dtype, torch.Tensor] = {}

    def mask(self, dtype: torch.dtype) -> torch.Tensor:
        """(rows, 1, columns, columns): query i attends key j <= i where j is real; every query attends to
        itself, so softmax stays finite on padding. Boolean for sdpa, additive in `dtype` for eager."""
        key = torch.bool if self.base_attention == "sdpa" else dtype
        if key not in self._masks:
            allowed = earlier_real_keys(self.real)[:, None]
            self._masks[key] = allowed if key is torch.bool else additive(allowed, dtype)
        return self._masks[key]


def ulysses_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """query (B, H, C, D), key/value (B, KVH, C, D) on this rank's C columns -> output (B, C, H, D)."""
    layout: UlyssesLayout | None = kwargs.pop(LAYOUT_KWARG, None)
    if layout is None:
        raise RuntimeError(f"attention {ULYSSES!r} was called without its layout: call the model through "
                           f"hybridrl.workers.sequence_parallel.SequenceParallel.forward")
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("sequence parallelism supports full attention only (no sliding windows)")
    layout.calls += 1
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads % layout.size:  # too few key/value heads to split: give every query head its own copy
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    # heads scattered, columns gathered: (B, H/size, C*size, D)
    query, key, value = (_AllToAll.apply(t, layout.group, 1, 2) for t in (query, key, value))
    mask = layout.mask(query.dtype)
    if layout.base_attention == "sdpa":
        output = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout if module.training else 0.0, scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1]).transpose(1, 2)  # (B, C*size, H/size, D)
    else:
        output, _ = grouped_eager_attention(module, query, key, value, mask, scaling=scaling, dropout=dropout)
    return _AllToAll.apply(output, layout.group, 1, 2), None  # columns scattered, heads gathered


AttentionInterface.register(ULYSSES, ulysses_attention)  # no mask function: transformers builds none


def ulysses_mode(module: nn.Module) -> contextlib.AbstractContextManager[None]:
    """`attention_mode` for `ULYSSES` (held around the backward too, which checkpointing reruns)."""
    return attention_mode(module, ULYSSES)


def model_problem(module: nn.Module, size: int) -> str | None:
    """Why `module` cannot run with sequence parallelism over `size` ranks, or None."""
    config = getattr(module, "config", None)
    attention = getattr(config, "_attn_implementation", None)
    if attention not in BASE_ATTENTION or not hasattr(module, "set_attn_implementation"):
        return (f"its attention is {attention!r}; sequence parallelism runs with {sorted(BASE_ATTENTION)} "
                f"(model.override_config.attn_implementation)")
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if any(t != "full_attention" for t in layer_types) or getattr(config, "use_sliding_window", False):
        return "it has sliding-window attention layers; sequence parallelism supports full attention only"
    heads = getattr(config, "num_attention_heads", None)
    if not heads or heads % size:
        return f"its {heads} attention heads do not divide among {size} ranks"
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if heads % kv_heads:
        return f"its {heads} attention heads do not share {kv_heads} key/value heads evenly"
    return None


def check_sequence_parallel(size: int, world_size: int, key: str) -> None:
    """A Ulysses group size must divide the role's ranks (each group shares its rows)."""
    if world_size % size:
        raise ConfigError(f"{key}={size} must divide the role's {world_size} ranks (trainer.nnodes x "
                          f"trainer.n_gpus_per_node, or the pool's size); groups of {size} ranks split each sequence")


@dataclass
class SequenceParallel:
    """This rank's sequence-parallel group: `size` consecutive ranks; `rank` is this rank's place in it."""

    size: int = 1
    rank: int = 0
    group: Any = None

    @classmethod
    def build(cls, size: int, key: str) -> SequenceParallel:
        """Groups of `size` consecutive ranks (a collective); `key` is the config key errors name."""
        if size < 1:
            raise ValueError(f"{key} must be >= 1, got {size}")
        if size == 1:
            return cls()
        world, rank = dist.get_world_size(), dist.get_rank()
        check_sequence_parallel(size, world, key)
        # every rank creates every group, in the same order
        groups = [dist.new_group(list(range(first, first + size)), timeout=collective_timeout())
                  for first in range(0, world, size)]
        return cls(size=size, rank=rank % size, group=groups[rank // size])

    @property
    def enabled(self) -> bool:
        return self.size > 1

    def gather_rows(self, data: DataProto, block_rows: int | None = None) -> DataProto:
        """The tensor columns of every rank's rows in the group (the passes read no others): in rank order, or
        with `block_rows` the ranks' k-th blocks of that many rows side by side for each k, so that a group's
        mini-batch holds the rows its ranks' mini-batches would hold without sequence parallelism."""
        if not self.enabled:
            return data
        columns = {}
        for name, value in data.batch.items():
            sent = value.to(torch.uint8) if value.dtype == torch.bool else value  # gloo gathers no bools
            parts = [torch.empty_like(sent) for _ in range(self.size)]
            dist.all_gather(parts, sent.contiguous(), group=self.group)
            columns[name] = torch.cat(parts).to(value.dtype)
        rows = len(data)
        gathered = DataProto(batch=TensorBatch(columns, batch_size=rows * self.size), meta_info=dict(data.meta_info))
        if block_rows is None or block_rows >= rows:
            return gathered
        order = [r * rows + i for start in range(0, rows, block_rows) for r in range(self.size)
                 for i in range(start, min(start + block_rows, rows))]
        return gathered.select_rows(torch.tensor(order, dtype=torch.long))

    def own_rows(self, value: torch.Tensor) -> torch.Tensor:
        """This rank's rows of an output over `gather_rows`' rows."""
        if not self.enabled:
            return value
        rows = value.shape[0] // self.size
        return value[self.rank * rows:(self.rank + 1) * rows]

    def forward(self, module: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor, first: int,
                count: int) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
        """A forward of the group over whole rows (rows, columns), this rank on its share of the columns.
        Returns the outputs at this rank's columns among `first` .. `first + count - 1` (rows, n, ...), their
        places in that range (n,), and each rank's n (the counts `gather_columns` joins the parts with)."""
        if position_ids.dim() != 2:
            raise NotImplementedError("sequence parallelism needs (rows, columns) position ids")
        width = input_ids.shape[1]
        share = math.ceil(width / self.size)
        pad = share * self.size - width  # right padding: masked keys, queries nobody reads
        if pad:
            input_ids, attention_mask, position_ids = (F.pad(t, (0, pad)) for t in (input_ids, attention_mask,
                                                                                   position_ids))
        counts = tuple(max(0, min(first + count, (r + 1) * share) - max(first, r * share)) for r in range(self.size))
        lo, hi = self.rank * share, (self.rank + 1) * share
        start = max(first, lo)
        wanted = torch.arange(start, start + counts[self.rank], device=input_ids.device)
        layout = UlyssesLayout(self.group, self.size, attention_mask, BASE_ATTENTION[own_attention(module)])
        head_kwargs, at_wanted = head_on_kept_positions(module, wanted - lo)
        with ulysses_mode(module):
            output = module(input_ids=input_ids[:, lo:hi], position_ids=position_ids[:, lo:hi], use_cache=False,
                            **head_kwargs, **{LAYOUT_KWARG: layout})
        if layout.calls == 0:
            raise RuntimeError(f"{type(module).__name__} did not pass {LAYOUT_KWARG!r} to its attention layers; "
                               f"it cannot run with sequence parallelism")
        return at_wanted(output.logits), wanted - first, counts

    def gather_columns(self, value: torch.Tensor, counts: tuple[int, ...]) -> torch.Tensor:
        """(rows, counts[rank], ...) on each rank -> the group's (rows, sum(counts), ...), differentiable."""
        return _GatherColumns.apply(value, self.group, self.rank, counts)

