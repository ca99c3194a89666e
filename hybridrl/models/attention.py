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

`shared_prompt_forward` runs one forward over rows that share prompts (the rollout.n responses of a
group), computing each distinct prompt once through a third attention implementation, `SHARED_PROMPT`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator

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


SHARED_PROMPT = "hybridrl_shared_prompt"
# The model attentions this module can run both parts with (others take arbitrary masks differently).
SUPPORTED_ATTENTION = ("sdpa", "eager", GROUPED_EAGER)
LAYOUT_KWARG = "shared_prompt_layout"
# the attention each model in shared_prompt_mode had before (by id: the block holds the module alive)
_base_of_mode: dict[int, str] = {}


# One forward pass over rows that share prompts, computing each distinct prompt once.
#
# GRPO, RLOO and every `rollout.n > 1` run train on n responses per prompt. A padded forward pass over
# those rows computes each prompt n times, although its hidden states, keys and values are the same in
# every copy (causal attention: a prompt token never sees the response). Here the distinct prompts go
# through the model once and every response attends to its prompt's keys and values:
#
#     packed sequence (batch 1):  [prompt_1 | ... | prompt_U | response_1 | ... | response_B]
#     prompt part:    causal attention within each prompt (left padding masked)
#     response part:  response b attends to prompt u(b)'s keys/values, then causally to its own tokens
#
# Token-wise work (projections, MLP, norms, rotary with each token's own position id) runs on U x P + B x R
# tokens instead of B x (P + R). The arithmetic of every kept position is the padded pass's, in another
# order of sums, and gradients reach the shared prompt through the gather (its backward sums the n
# responses' contributions, as the n copies' gradients would have summed). The saving grows with the
# prompt's share of each row and with n, and shows in whole steps (measured for the critic's passes:
# benchmarks/results/critic_passes.md; the actor's with benchmarks/grpo_vs_trl.py, runner
# hybridrl-local-padded against hybridrl-local).
#
# It runs through transformers' attention interface: the model's `_attn_implementation` is switched to
# `SHARED_PROMPT` for the call, the layout rides along in the forward's keyword arguments to every
# attention layer, and the model's own attention (sdpa, eager or grouped_eager) computes both parts with
# masks built here. transformers builds no mask of its own for an implementation without a registered
# mask function, so no (U x P + B x R)^2 mask is ever made.
def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(group id of each row (rows,), first row of each group (groups,)): rows whose prompt columns
    (token ids where the mask is 1, and the mask itself) are equal share an id; ids are numbered in order
    of first appearance."""
    keyed = torch.where(prompt_mask.bool(), prompt_ids, torch.full_like(prompt_ids, -1))  # pad ids ignored
    _, inverse = torch.unique(keyed, dim=0, return_inverse=True)
    # renumber by first appearance so the ids do not depend on torch.unique's sort order
    first_row = torch.full((int(inverse.max()) + 1,), len(inverse), dtype=torch.long, device=inverse.device)
    first_row.scatter_reduce_(0, inverse, torch.arange(len(inverse), device=inverse.device), reduce="amin")
    by_appearance = torch.argsort(first_row)
    rank = torch.empty_like(first_row)
    rank[by_appearance] = torch.arange(len(first_row), device=first_row.device)
    return rank[inverse], first_row[by_appearance]


def _earlier_real_keys(mask: torch.Tensor) -> torch.Tensor:
    """(N, L) 1 on real tokens -> (N, L, L) True where query i attends key j: j <= i and j is real, or j = i."""
    width = mask.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=mask.device).tril()
    return (causal & mask[:, None, :]) | torch.eye(width, dtype=torch.bool, device=mask.device)


class SharedPromptLayout:
    """Where each part lies in the packed sequence, and the masks of both parts (built once per call and
    dtype, then read by every layer). A plain class, not a dataclass: FSDP's input casting walks
    dataclasses and would rebuild it for every layer."""

    def __init__(self, prompt_of_row: torch.Tensor, prompt_mask: torch.Tensor, response_mask: torch.Tensor,
                 base_attention: str) -> None:
        self.prompt_of_row = prompt_of_row  # (B,) index of each row's prompt among the U distinct ones
        self.prompt_mask = prompt_mask.bool()  # (U, P) 1 on real prompt tokens
        self.response_mask = response_mask.bool()  # (B, R) 1 on tokens the row attends to
        self.base_attention = base_attention
        self.calls = 0  # attention layers that read this layout (a model that drops the kwarg reads none)
        self._masks: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def unique_prompts(self) -> int:
        return self.prompt_mask.shape[0]

    @property
    def prompt_width(self) -> int:
        return self.prompt_mask.shape[1]

    @property
    def rows(self) -> int:
        return self.response_mask.shape[0]

    @property
    def response_width(self) -> int:
        return self.response_mask.shape[1]

    def masks(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompt part (U, 1, P, P), response part (B, 1, R, P + R)): boolean (True attends) for sdpa,
        additive in `dtype` for the eager kinds. A query attends to itself always, so a padding query
        (whose output nothing reads) has one key and softmax stays finite."""
        key = torch.bool if self.base_attention == "sdpa" else dtype
        if key not in self._masks:
            device = self.prompt_mask.device
            prompt = _earlier_real_keys(self.prompt_mask)  # (U, P, P)
            own = _earlier_real_keys(self.response_mask)  # (B, R, R)
            shared = self.prompt_mask[self.prompt_of_row][:, None, :].expand(-1, self.response_width, -1)  # (B, R, P)
            response = torch.cat([shared, own], dim=-1)  # (B, R, P + R)
            prompt, response = prompt[:, None], response[:, None]
            if key is not torch.bool:
                low = torch.finfo(dtype).min
                prompt = torch.zeros(prompt.shape, dtype=dtype, device=device).masked_fill_(~prompt, low)
                response = torch.zeros(response.shape, dtype=dtype, device=device).masked_fill_(~response, low)
            self._masks[key] = (prompt, response)
        return self._masks[key]


def _base_attention(name: str):
    if name == "sdpa":
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward
    return grouped_eager_attention  # eager's arithmetic without copying the key/value heads


def shared_prompt_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query (1, H, U*P + B*R, D), key/value (1, KVH, U*P + B*R, D) -> output (1, U*P + B*R, H, D)."""
    layout: SharedPromptLayout | None = kwargs.pop(LAYOUT_KWARG, None)
    if layout is None:
        raise RuntimeError(
            f"attention {SHARED_PROMPT!r} was called without its layout: call the model through "
            f"hybridrl.models.attention.shared_prompt_forward"
        )
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("shared-prompt forward passes support full attention only (no sliding windows)")
    layout.calls += 1
    u, p, b, r = layout.unique_prompts, layout.prompt_width, layout.rows, layout.response_width
    split = u * p

    def parts(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        heads, dim = t.shape[1], t.shape[-1]
        prompt = t[0, :, :split].reshape(heads, u, p, dim).transpose(0, 1)  # (U, heads, P, D)
        response = t[0, :, split:].reshape(heads, b, r, dim).transpose(0, 1)  # (B, heads, R, D)
        return prompt, response

    (q_prompt, q_response), (k_prompt, k_response), (v_prompt, v_response) = parts(query), parts(key), parts(value)
    prompt_mask, response_mask = layout.masks(query.dtype)
    attend = _base_attention(layout.base_attention)
    kwargs.pop("is_causal", None)
    out_prompt, _ = attend(module, q_prompt, k_prompt, v_prompt, prompt_mask, scaling=scaling, dropout=dropout,
                           is_causal=False, **kwargs)  # (U, P, H, D)
    # each response reads its prompt's keys/values: the gather's backward sums the responses' gradients
    k_full = torch.cat([k_prompt[layout.prompt_of_row], k_response], dim=2)  # (B, KVH, P + R, D)
    v_full = torch.cat([v_prompt[layout.prompt_of_row], v_response], dim=2)
    out_response, _ = attend(module, q_response, k_full, v_full, response_mask, scaling=scaling, dropout=dropout,
                             is_causal=False, **kwargs)  # (B, R, H, D)
    heads, dim = out_prompt.shape[-2], out_prompt.shape[-1]
    output = torch.cat([out_prompt.reshape(1, split, heads, dim), out_response.reshape(1, b * r, heads, dim)], dim=1)
    return output, None


AttentionInterface.register(SHARED_PROMPT, shared_prompt_attention)  # no mask function: transformers builds none


def supports_shared_prompt(module: nn.Module) -> bool:
    """A transformers decoder with full attention in every layer, running one of SUPPORTED_ATTENTION."""
    config = getattr(module, "config", None)
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return (
        getattr(config, "_attn_implementation", None) in SUPPORTED_ATTENTION
        and hasattr(module, "set_attn_implementation")
        and all(t == "full_attention" for t in layer_types)
        and not getattr(config, "use_sliding_window", False)
    )


@contextlib.contextmanager
def shared_prompt_mode(module: nn.Module) -> Iterator[None]:
    """The model's attention is `SHARED_PROMPT` for the block (from the model's own, which comes back after).

    `shared_prompt_forward` switches for its own call; a block around forward *and* backward is needed
    where the backward runs a layer's forward again (gradient checkpointing), and then every forward in
    it must be a `shared_prompt_forward`.
    """
    current = module.config._attn_implementation
    if current == SHARED_PROMPT:
        yield
        return
    module.set_attn_implementation(SHARED_PROMPT)
    _base_of_mode[id(module)] = current
    try:
        yield
    finally:
        module.set_attn_implementation(current)
        del _base_of_mode[id(module)]


@functools.cache
def _head_takes_logits_to_keep(module_class: type) -> bool:
    return "logits_to_keep" in inspect.signature(module_class.forward).parameters


def head_on_kept_positions(module: nn.Module, keep: torch.Tensor | int) -> tuple[dict, Callable]:
    """(extra forward kwargs, a function of the output's logits) that give the head's outputs at `keep` only
    (a count of last columns, or column indices into the sequence): a causal LM computes its head there
    alone (`logits_to_keep`); a head without that argument (a token-classification model: a critic's
    values, one number per position) runs on every position and is indexed after."""
    if _head_takes_logits_to_keep(type(module)):
        return {"logits_to_keep": keep}, lambda logits: logits
    if isinstance(keep, int):
        return {}, lambda logits: logits[:, -keep:]
    return {}, lambda logits: logits[:, keep]


def shared_prompt_forward(
    module: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_start: int,
    response_kept: int,
    prompt_of_row: torch.Tensor,
    unique_rows: torch.Tensor,
) -> torch.Tensor:
    """Logits predicting each kept response token, (B, response_kept, vocab), as a padded forward pass over
    `input_ids` (B, response_start + response_kept) would give them; for a token-classification model
    (a critic) its outputs at the same positions, (B, response_kept, labels).

    `prompt_of_row` (B,) numbers each row's prompt among the distinct ones; `unique_rows` (U,) is one row
    holding each distinct prompt, in that numbering. Columns before `response_start` are the prompt
    (left-padded), the rest the response (right-padded).
    """
    if response_kept < 1:
        raise ValueError("shared_prompt_forward needs at least one response column")
    p, r = response_start, response_kept
    rows, u = input_ids.shape[0], unique_rows.shape[0]
    base = module.config._attn_implementation
    if base == SHARED_PROMPT:  # inside shared_prompt_mode: the model's own is the one it switched from
        base = _base_of_mode[id(module)]
    layout = SharedPromptLayout(prompt_of_row, attention_mask[unique_rows, :p], attention_mask[:, p:], base)
    packed_ids = torch.cat([input_ids[unique_rows, :p].reshape(-1), input_ids[:, p:].reshape(-1)])[None]
    packed_positions = torch.cat([position_ids[unique_rows, :p].reshape(-1), position_ids[:, p:].reshape(-1)])[None]
    # logits at a prompt's last column predict the first response token; a response column predicts the next
    device = input_ids.device
    first = prompt_of_row * p + (p - 1)  # (B,)
    rest = u * p + torch.arange(rows, device=device)[:, None] * r + torch.arange(r - 1, device=device)  # (B, R-1)
    keep = torch.cat([first[:, None], rest], dim=1).reshape(-1)  # (B*R,)
    head_kwargs, at_kept = head_on_kept_positions(module, keep)
    with shared_prompt_mode(module):
        output = module(input_ids=packed_ids, position_ids=packed_positions, use_cache=False,
                        **head_kwargs, **{LAYOUT_KWARG: layout})
    expected = getattr(module.config, "num_hidden_layers", None)
    if expected is not None and layout.calls != expected:
        raise RuntimeError(
            f"{type(module).__name__}'s attention layers read the shared-prompt layout {layout.calls} times, "
            f"not once per layer ({expected}): this model does not pass the forward's keyword arguments to its "
            f"attention. Set actor_rollout_ref.model.share_prompt_forward=false (critic.model.share_prompt_forward "
            f"for a critic)."
        )
    return at_kept(output.logits).view(rows, r, -1)
