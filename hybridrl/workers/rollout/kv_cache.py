"""A KV cache preallocated for the whole generation, written in place, with row dropping.

transformers' `DynamicCache` appends each step's keys/values with `torch.cat`, which copies the whole
cache of every layer on every step: O(L^2) memory traffic over a generation of length L, and at the
rollout's batch sizes (hundreds of rows) that copy costs as much as the model's matmuls on CPU.
`StaticCache` writes in place but hands attention the full `max_len` buffer on every step, so early
steps attend over (masked) empty slots.

`PreallocatedCache` does neither: each layer holds (rows, kv_heads, max_len, head_dim) buffers, a step
writes its keys/values at the current length, and attention gets a view of the written prefix only
(no copy), exactly the tensor `DynamicCache` would have built. Finished rows leave with
`batch_select_indices`, which copies only the written prefix of the surviving rows.

It plugs into any transformers model through the public `Cache` / `CacheLayerMixin` API (transformers
5.x): the model calls `update(key, value, layer_idx)`, and the mask builder asks `get_seq_length` and
`get_mask_sizes`, which report the written length like `DynamicLayer` does.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class PreallocatedLayer(CacheLayerMixin):
    """One attention layer's keys and values in fixed (rows, kv_heads, max_len, head_dim) buffers."""

    is_sliding = False
    is_compileable = False

    def __init__(self, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.length = 0  # positions written so far, the same for every row

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        rows, heads, _, k_dim = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        # Written positions are always overwritten before they are read, so empty (not zeros) is enough.
        self.keys = key_states.new_empty(rows, heads, self.max_len, k_dim)  # (rows, H, max_len, Dk)
        self.values = value_states.new_empty(rows, heads, self.max_len, value_states.shape[-1])
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (rows, H, q, D) new states at the current length; return views of all written ones."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.max_len:
            raise ValueError(
                f"PreallocatedLayer holds {self.max_len} positions; writing {start}..{end} overflows it "
                "(build the cache with max_len >= prompt length + response length)"
            )
        self.keys[:, :, start:end] = key_states
        self.values[:, :, start:end] = value_states
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]  # (rows, H, end, D) views, no copy

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) for the mask builder: the written positions plus the query."""
        return self.length + query_length, 0

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
        """Keep only rows `indices`, copying just their written prefix into fresh buffers."""
        if not self.is_initialized:
            return
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
    """

    def __init__(self, num_layers: int, max_len: int) -> None:
        super().__init__(layers=[PreallocatedLayer(max_len) for _ in range(num_layers)])
