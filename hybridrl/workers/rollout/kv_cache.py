"""`PreallocatedCache`: a KV cache for the whole generation, written in place (no `torch.cat` per layer per
step), with row dropping; with `full_width` attention reads the buffers whole, unwritten positions masked (a
CPU's batched matmul would copy a strided prefix view). `ForwardSteps`: the eager loop's plain step.
"""

from __future__ import annotations

from importlib.metadata import version

import torch
import torch.nn.functional as F
from packaging.version import Version
from torch import nn
from transformers.cache_utils import Cache, CacheLayerMixin

from hybridrl.models.attention import forward_takes

# The oldest transformers whose cache-layer interface these layers implement (pyproject.toml's bound).
MIN_TRANSFORMERS = (5, 17)


def check_transformers(found: str) -> None:
    """Raise ImportError naming the fix when transformers `found` predates MIN_TRANSFORMERS."""
    if Version(found).release[:2] < MIN_TRANSFORMERS:
        wanted = ".".join(map(str, MIN_TRANSFORMERS))
        raise ImportError(f"hybridrl's rollout needs transformers>={wanted}, found {found}: its KV-cache layers "
                          f"implement transformers 5's cache interface. pip install 'transformers>={wanted}'")


check_transformers(version("transformers"))


def cache_keyword(model: nn.Module | type[nn.Module]) -> str:
    """The keyword `model`'s (or a model class's) forward takes its KV cache by (`cache` from transformers 5.24)."""
    model_class = model if isinstance(model, type) else type(model)
    return "cache" if forward_takes(model_class, "cache") else "past_key_values"


def forward_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   position_ids: torch.Tensor, cache: Cache) -> torch.Tensor:
    """`model`'s next-token logits (rows, vocab) after the last column of `input_ids`, keys/values into `cache`."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                **{cache_keyword(model): cache}, use_cache=True,
                logits_to_keep=1)  # only the last position's logits: a prefill skips P-1 vocab projections
    return out.logits[:, -1, :]


# The least a full-width cache grows by when a write overflows it (it also grows by a quarter of its width).
FULL_WIDTH_GROWTH = 16


class BufferLayer(CacheLayerMixin):
    """A full-attention layer's keys and values in (rows, kv_heads, width, head_dim) buffers of its own; `owner`:
    the cache holding where its layers write, for layers that share that."""

    is_sliding = False

    def __init__(self, owner: Cache | None = None) -> None:
        super().__init__()
        self.owner = owner

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Give every row `repeats` consecutive copies (prompt i's samples are rows i*n .. i*n+n-1)."""
        if self.is_initialized:
            self.keys = self.keys.repeat_interleave(repeats, dim=0)
            self.values = self.values.repeat_interleave(repeats, dim=0)


class PreallocatedLayer(BufferLayer):
    """One attention layer's keys and values in (rows, kv_heads, capacity, head_dim) buffers."""

    def __init__(self, max_len: int, full_width: bool = False) -> None:
        super().__init__()
        self.max_len = max_len
        self.full_width = full_width
        self.length = 0  # positions written so far, the same for every row
        self.capacity = 0  # positions the buffers hold now: max_len, or less while a full width grows

    def _capacity_for(self, end: int) -> int:
        """The buffers' width once `end` positions are written: max_len for a prefix view; a full width grows."""
        if not self.full_width:
            return self.max_len
        if end <= self.capacity:
            return self.capacity
        return min(self.max_len, end + max(FULL_WIDTH_GROWTH, self.capacity // 4))

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        rows, heads, _, k_dim = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        # the full width shows unwritten slots: zeros, since garbage could hold NaN, which survives the mask
        new = key_states.new_zeros if self.full_width else key_states.new_empty
        self.capacity = self._capacity_for(key_states.shape[-2])
        self.keys = new(rows, heads, self.capacity, k_dim)  # (rows, H, capacity, Dk)
        self.values = new(rows, heads, self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (rows, H, q, D) states at the current length -> the written prefix as views (full_width: all)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.max_len:
            raise ValueError(
                f"PreallocatedLayer holds {self.max_len} positions; writing {start}..{end} overflows it "
                "(build the cache with max_len >= prompt length + response length)"
            )
        if end > self.capacity:  # the written positions move into zeroed buffers wide enough
            self.capacity = self._capacity_for(end)
            pad = (0, 0, 0, self.capacity - self.length)
            self.keys, self.values = (F.pad(b[:, :, : self.length], pad) for b in (self.keys, self.values))
        self.keys[:, :, start:end] = key_states
        self.values[:, :, start:end] = value_states
        self.length = end
        if self.full_width:
            return self.keys, self.values  # (rows, H, capacity, D)
        return self.keys[:, :, :end], self.values[:, :, :end]  # (rows, H, end, D) views, no copy

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) for the mask builder: what attention reads after this update."""
        end = self.length + query_length
        return (self._capacity_for(end) if self.full_width else end), 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.max_len

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only rows `indices`, in fresh buffers (copying the written prefix, or all of a full width)."""
        if self.is_initialized:
            copied = self.capacity if self.full_width else self.length
            self.keys, self.values = (_select_prefix(b, indices, copied) for b in (self.keys, self.values))

    def reset(self) -> None:
        self.length = 0


def _select_prefix(buffer: torch.Tensor, indices: torch.Tensor, length: int) -> torch.Tensor:
    """Rows `indices` of a (rows, H, width, D) buffer in a new buffer; only [:length] is copied."""
    out = buffer.new_empty(indices.numel(), *buffer.shape[1:])  # (kept, H, width, D)
    out[:, :, :length] = buffer[:, :, :length].index_select(0, indices)
    return out


class PreallocatedCache(Cache):
    """A transformers `Cache` of `num_layers` `PreallocatedLayer`s of `max_len` positions (full attention only)."""

    def __init__(self, num_layers: int, max_len: int, full_width: bool = False) -> None:
        super().__init__(layers=[PreallocatedLayer(max_len, full_width) for _ in range(num_layers)])


class ForwardSteps:
    """The eager loops' decoding step over a KV cache: the model's forward, or where `decoder` (a `FusedDecoder`,
    tested equal to the forward) is given, its step after the forward's prefill."""

    def __init__(self, model: nn.Module, cache: Cache, decoder: object | None = None) -> None:
        self.model, self.cache, self.decoder = model, cache, decoder

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                n: int) -> torch.Tensor:
        """Each prompt (B, P) through the model once, copied for its n samples -> logits (B*n, V)."""
        logits = forward_logits(self.model, input_ids, attention_mask, position_ids, self.cache)  # (B, V)
        if n > 1:
            self.cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
        return logits

    def select(self, keep: torch.Tensor) -> None:
        """Only the rows `keep` (indices into the current rows) go on decoding."""
        self.cache.batch_select_indices(keep)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """tokens (A,) at positions (A,), the rows' 0/1 mask, this token last (A, W) -> next-token logits (A, V)."""
        if self.decoder is not None:
            return self.decoder.step(tokens, positions, self.cache, seen)
        return forward_logits(self.model, tokens[:, None], seen, positions[:, None], self.cache)
