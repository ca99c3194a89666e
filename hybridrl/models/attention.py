"""Grouped-query attention that reads each key/value head in place: `attn_implementation="grouped_eager"`,
and `"grouped_sdpa"` for decoding.

transformers' eager attention copies every key and value head `heads / kv_heads` times (`repeat_kv`)
before its two matmuls. While decoding, that copies the whole KV cache of every layer at every step, a
large share of a small model's decoding time on a CPU. Here the query heads that share a key/value head
are stacked along the query axis instead, so each matmul reads the cache as it is:

    scores[b, g, r*Q + q, k] = <query[b, g*R + r, q], key[b, g, k]> * scaling     (R = heads / kv_heads)

which is eager attention's arithmetic, softmax in fp32 included, in another order of memory.
`default_attention` picks it for half precision on a CPU, where torch's fused sdpa kernels are slower.

`grouped_sdpa_attention` does the same for torch's sdpa kernel while decoding (one query token): the
query heads that share a key/value head become that head's queries, so sdpa reads the cache once per
key/value head. transformers' own sdpa attention stacks them that way only since 5.23; before, it
copied the cache `heads / kv_heads` times at every layer and step (a 1.5B-layout Qwen2 decoding 256
rows: 6 copies of each layer's keys and values, ~8 GB moved per step). Any other call is transformers'
sdpa attention unchanged. `decoding_attention` picks it wherever decoding runs sdpa.
Importing this module registers both with transformers (hybridrl's model loader imports it).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

GROUPED_EAGER = "grouped_eager"
GROUPED_SDPA = "grouped_sdpa"


def grouped_eager_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """query (B, H, Q, D), key/value (B, KVH, K, D), additive mask (B, 1, Q, K) -> output (B, Q, H, D)
    and the attention probabilities (B, H, Q, K)."""
    batch, heads, q_len, head_dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    group = heads // kv_heads
    stacked = query.reshape(batch, kv_heads, group * q_len, head_dim)  # heads sharing a KV head, stacked
    scores = torch.matmul(stacked, key.transpose(2, 3)) * scaling  # (B, KVH, R*Q, K)
    if attention_mask is not None:
        grouped = scores.view(batch, kv_heads, group, q_len, k_len)
        scores = (grouped + attention_mask[:, :, None, :, :k_len]).view(batch, kv_heads, group * q_len, k_len)
    probs = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    output = torch.matmul(probs, value)  # (B, KVH, R*Q, D)
    output = output.view(batch, heads, q_len, head_dim).transpose(1, 2).contiguous()  # (B, Q, H, D)
    return output, probs.view(batch, heads, q_len, k_len)


def grouped_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query (B, H, 1, D), key/value (B, KVH, K, D), a mask shared by the heads (B, 1, 1, K) or none ->
    output (B, 1, H, D); every other call goes to transformers' sdpa attention as it is."""
    batch, heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    shared_mask = attention_mask is None or attention_mask.shape[1] == 1
    if q_len != 1 or heads == kv_heads or not shared_mask or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    stacked = query.reshape(batch, kv_heads, heads // kv_heads, head_dim)  # a KV head's query heads, stacked
    output = nn.functional.scaled_dot_product_attention(  # (B, KVH, H/KVH, D); the mask broadcasts over both
        stacked, key, value, attn_mask=attention_mask, dropout_p=dropout if module.training else 0.0,
        scale=scaling)
    return output.reshape(batch, 1, heads, head_dim), None


def decoding_attention(compute_dtype: torch.dtype, device_type: str) -> str:
    """The attention to decode with: `default_attention`'s, with sdpa's grouped form in place of sdpa."""
    chosen = default_attention(compute_dtype, device_type)
    return GROUPED_SDPA if chosen == "sdpa" else chosen


def default_attention(compute_dtype: torch.dtype, device_type: str) -> str:
    """The attention implementation a model computing in `compute_dtype` on `device_type` runs best with.

    sdpa, except on a CPU in half precision: there torch's fused CPU attention kernels are slower than
    plain matmul + softmax, which `grouped_eager_attention` runs without copying the key/value heads
    (measured in bf16: benchmarks/README.md, "GRPO side by side with TRL (`grpo_vs_trl.py`)"); in fp32
    sdpa is no slower than eager. Decoding: hybridrl/workers/rollout/hf.py, `attention_for_decoding`.
    `model.override_config.attn_implementation` overrides this choice.
    """
    half = compute_dtype in (torch.bfloat16, torch.float16)
    return GROUPED_EAGER if device_type == "cpu" and half else "sdpa"


AttentionInterface.register(GROUPED_EAGER, grouped_eager_attention)
AttentionMaskInterface.register(GROUPED_EAGER, eager_mask)  # the same additive mask eager attention takes
AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)  # the mask sdpa attention takes
