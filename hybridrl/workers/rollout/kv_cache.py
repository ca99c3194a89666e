"""A KV cache preallocated for the whole generation, written in place, with row dropping.

transformers' `DynamicCache` appends each step's keys/values with `torch.cat`, which copies the whole
cache of every layer on every step: O(L^2) memory traffic over a generation of length L, and at the
rollout's batch sizes (hundreds of rows) that copy costs as much as the model's matmuls on CPU.

`PreallocatedCache` keeps each layer in (rows, kv_heads, max_len, head_dim) buffers; a step writes its
keys/values at the current length. What attention reads depends on `full_width`:

- `full_width=False`: a view of the written prefix, exactly the tensor `DynamicCache` would have built.
  No copy on the cache's side, but the prefix of a longer buffer is not contiguous, and torch's CPU
  batched matmul copies such an operand (the transposed key, in bf16) before multiplying.
- `full_width=True`: the whole buffers, contiguous, with the unwritten positions zero and masked out
  (the mask builder is told the cache is `max_len` long, as for transformers' `StaticCache`). Attention
  reads `max_len` positions where it needs the written ones, but reads them in place, which measured
  faster in bf16 than the prefix's copies, with identical tokens; in fp32 with sdpa the two were alike.
  The HF rollout uses it on the CPU.
  So that reading the whole buffers does not mean reading every position the longest response could
  reach from the first step on, a full-width layer starts as wide as the prompt plus `FULL_WIDTH_GROWTH`
  positions and grows (a copy of the written positions) when a write would overflow it. Decoding reads
  the cache from memory at every step (a 50M model's cache outgrows a CPU's L3), so the width matters:
  growing in small steps measured faster than taking the whole width from the start, at 10M and 50M.

Finished rows leave with `batch_select_indices`, which copies only the surviving rows.

It plugs into any transformers model through the public `Cache` / `CacheLayerMixin` API (transformers
5.x): the model calls `update(key, value, layer_idx)`, and the mask builder asks `get_seq_length` and
`get_mask_sizes`.
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import nn
from transformers.cache_utils import Cache, CacheLayerMixin


def cache_keyword(model: nn.Module | type[nn.Module]) -> str:
    """The keyword `model`'s forward (or a model class's) takes its KV cache by: `cache` in transformers
    5.24 on, where `past_key_values` is a deprecated alias due to go in 5.40 (after which a cache passed
    under the old name would land in `**kwargs`, unused), `past_key_values` before and in models that know
    no other."""
    return _cache_keyword_of(model if isinstance(model, type) else type(model))


@functools.cache
def _cache_keyword_of(model_class: type) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


# The least a full-width cache grows by when a write overflows it (it also grows by a quarter of its width).
FULL_WIDTH_GROWTH = 16


class PreallocatedLayer(CacheLayerMixin):
    """One attention layer's keys and values in fixed (rows, kv_heads, max_len, head_dim) buffers.

    `full_width`: attention reads the whole buffers (unwritten positions zero, masked) instead of a view
    of the written prefix; see the module docstring for when each is faster.
    """

    is_sliding = False
    is_compileable = False

    def __init__(self, max_len: int, full_width: bool = False) -> None:
        super().__init__()
        self.max_len = max_len
        self.full_width = full_width
        self.length = 0  # positions written so far, the same for every row
        self.capacity = 0  # positions the buffers hold now: max_len, or less while a full width grows

    def _capacity_for(self, end: int) -> int:
        """The buffers' width once `end` positions are written. A prefix view reads only what is written,
        so its buffers hold max_len from the start; the full width grows in steps of at least
        `FULL_WIDTH_GROWTH` positions (or a quarter of its width), as needed."""
        if not self.full_width:
            return self.max_len
        if end <= self.capacity:
            return self.capacity
        return min(self.max_len, end + max(FULL_WIDTH_GROWTH, self.capacity // 4))

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        rows, heads, _, k_dim = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        # A prefix view never shows an unwritten slot, so empty is enough there. The full width shows them:
        # they must be zeros, since garbage could hold NaN, and NaN survives the mask (NaN - inf, 0 * NaN).
        new = key_states.new_zeros if self.full_width else key_states.new_empty
        self.capacity = self._capacity_for(key_states.shape[-2])
        self.keys = new(rows, heads, self.capacity, k_dim)  # (rows, H, capacity, Dk)
        self.values = new(rows, heads, self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def _grow(self, capacity: int) -> None:
        """Move the written positions into zeroed buffers `capacity` wide."""
        for name in ("keys", "values"):
            old = getattr(self, name)
            grown = old.new_empty(*old.shape[:2], capacity, old.shape[-1])
            grown[:, :, : self.length] = old[:, :, : self.length]
            grown[:, :, self.length :].zero_()  # only the unwritten slots: the written ones were just copied
            setattr(self, name, grown)
        self.capacity = capacity

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (rows, H, q, D) new states at the current length; return the written ones as views, or
        the whole buffers with `full_width`."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.max_len:
            raise ValueError(
                f"PreallocatedLayer holds {self.max_len} positions; writing {start}..{end} overflows it "
                "(build the cache with max_len >= prompt length + response length)"
            )
        if end > self.capacity:
            self._grow(self._capacity_for(end))
        self.keys[:, :, start:end] = key_states
        self.values[:, :, start:end] = value_states
        self.length = end
        if self.full_width:
            return self.keys, self.values  # (rows, H, capacity, D)
        return self.keys[:, :, :end], self.values[:, :, :end]  # (rows, H, end, D) views, no copy

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) for the mask builder: what attention will read after this update (the
        whole buffer with `full_width`, grown for the query if need be; else the written positions plus
        the query)."""
        end = self.length + query_length
        return (self._capacity_for(end) if self.full_width else end), 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.max_len

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Give every row `repeats` consecutive copies (prompt i's samples are rows i*n .. i*n+n-1)."""
        if self.is_initialized:
            self.keys = self.keys.repeat_interleave(repeats, dim=0)
            self.values = self.values.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only rows `indices` in fresh buffers (their written prefix; all of it with `full_width`,
        so the unwritten slots stay zero)."""
        if not self.is_initialized:
            return
        if self.full_width:
            self.keys, self.values = self.keys.index_select(0, indices), self.values.index_select(0, indices)
        else:
            self.keys = _select_prefix(self.keys, indices, self.length)
            self.values = _select_prefix(self.values, indices, self.length)

    def reset(self) -> None:
        self.length = 0


def _select_prefix(buffer: torch.Tensor, indices: torch.Tensor, length: int) -> torch.Tensor:
    """Rows `indices` of a (rows, H, max_len, D) buffer in a new buffer; only [:length] is copied."""
    out = buffer.new_empty(indices.numel(), *buffer.shape[1:])  # (kept, H, max_len, D)
    out[:, :, :length] = buffer[:, :, :length].index_select(0, indices)
    return out


class PreallocatedCache(Cache):
    """A transformers `Cache` of `num_layers` `PreallocatedLayer`s, each `max_len` positions long.

    Use it for full-attention decoders (every layer attends to every earlier position); the HF
    rollout falls back to `DynamicCache` for models with sliding-window or other layer types.
    `full_width`: see `PreallocatedLayer`.
    """

    def __init__(self, num_layers: int, max_len: int, full_width: bool = False) -> None:
        super().__init__(layers=[PreallocatedLayer(max_len, full_width) for _ in range(num_layers)])
