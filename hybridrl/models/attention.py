"""Attention implementations registered with transformers on import: `grouped_eager` and `grouped_sdpa` read
each key/value head once; `SHARED_PROMPT` (`shared_prompt_forward`) computes each distinct prompt once.
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
    """Eager attention with the query heads sharing a key/value head stacked: query (B, H, Q, D), key/value
    (B, KVH, K, D), additive mask (B, 1, Q, K) -> output (B, Q, H, D) and probabilities (B, H, Q, K)."""
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
    """`default_attention`'s, with sdpa's grouped form in place of sdpa."""
    chosen = default_attention(compute_dtype, device_type)
    return GROUPED_SDPA if chosen == "sdpa" else chosen


@contextlib.contextmanager
def attention_for_decoding(module: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """`decoding_attention` for the block where the model runs transformers' sdpa/eager ones."""
    current = getattr(getattr(module, "config", None), "_attn_implementation", None)
    wanted = decoding_attention(dtype, next(module.parameters()).device.type)
    switch = current in ("sdpa", "eager", GROUPED_EAGER, GROUPED_SDPA) and wanted != current \
        and hasattr(module, "set_attn_implementation")
    if switch:
        module.set_attn_implementation(wanted)
    try:
        yield
    finally:
        if switch:
            module.set_attn_implementation(current)


def default_attention(compute_dtype: torch.dtype, device_type: str) -> str:
    """sdpa, except `grouped_eager` on a CPU in half precision, where torch's fused CPU kernels are slower
    (`model.override_config.attn_implementation` overrides this choice)."""
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
# the attention each model in an attention_mode block had before (by id: the block holds the module alive)
_base_of_mode: dict[int, str] = {}


# Shared-prompt forward: the packed sequence (batch 1) is [prompt_1 | ... | prompt_U | response_1 | ... |
# response_B]; each prompt attends causally to itself, each response to its prompt's keys/values and then
# causally to its own tokens. The layout rides in the forward's kwargs.
def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(group id of each row (rows,), first row of each group (groups,)): rows with equal real prompt tokens and
    masks share an id, numbered in order of first appearance."""
    keyed = torch.where(prompt_mask.bool(), prompt_ids, torch.full_like(prompt_ids, -1))  # pad ids ignored
    _, inverse = torch.unique(keyed, dim=0, return_inverse=True)
    # renumber by first appearance so the ids do not depend on torch.unique's sort order
    first_row = torch.full((int(inverse.max()) + 1,), len(inverse), dtype=torch.long, device=inverse.device)
    first_row.scatter_reduce_(0, inverse, torch.arange(len(inverse), device=inverse.device), reduce="amin")
    by_appearance = torch.argsort(first_row)
    rank = torch.empty_like(first_row)
    rank[by_appearance] = torch.arange(len(first_row), device=first_row.device)
    return rank[inverse], first_row[by_appearance]


def earlier_real_keys(mask: torch.Tensor) -> torch.Tensor:
    """(N, L) 1 on real tokens -> (N, L, L) True where query i attends key j: j <= i and j is real, or j = i
    (so softmax stays finite on padding queries)."""
    width = mask.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=mask.device).tril()
    return (causal & mask[:, None, :]) | torch.eye(width, dtype=torch.bool, device=mask.device)


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask as the additive one eager attention takes: 0 where allowed, else dtype's min."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, torch.finfo(dtype).min)


class SharedPromptLayout:
    """The packed sequence's parts and their masks (built once per dtype). Not a dataclass: FSDP's input casting
    would rebuild a dataclass for every layer."""

    def __init__(self, prompt_of_row: torch.Tensor, prompt_mask: torch.Tensor, response_mask: torch.Tensor,
                 base_attention: str) -> None:
        self.prompt_of_row = prompt_of_row  # (B,) index of each row's prompt among the U distinct ones
        self.prompt_mask = prompt_mask.bool()  # (U, P) 1 on real prompt tokens
        self.response_mask = response_mask.bool()  # (B, R) 1 on tokens the row attends to
        self.base_attention = base_attention
        self.unique_prompts, self.prompt_width = self.prompt_mask.shape
        self.rows, self.response_width = self.response_mask.shape
        self.calls = 0  # attention layers that read this layout (a model that drops the kwarg reads none)
        self._masks: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def masks(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompt part (U, 1, P, P), response part (B, 1, R, P + R)): boolean for sdpa, else additive in `dtype`."""
        key = torch.bool if self.base_attention == "sdpa" else dtype
        if key not in self._masks:
            prompt = earlier_real_keys(self.prompt_mask)  # (U, P, P)
            own = earlier_real_keys(self.response_mask)  # (B, R, R)
            shared = self.prompt_mask[self.prompt_of_row][:, None, :].expand(-1, self.response_width, -1)  # (B, R, P)
            response = torch.cat([shared, own], dim=-1)  # (B, R, P + R)
            prompt, response = prompt[:, None], response[:, None]
            if key is not torch.bool:
                prompt, response = additive(prompt, dtype), additive(response, dtype)
            self._masks[key] = (prompt, response)
        return self._masks[key]


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
    # grouped_eager is eager's arithmetic without copying the key/value heads
    attend = sdpa_attention_forward if layout.base_attention == "sdpa" else grouped_eager_attention
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
def attention_mode(module: nn.Module, name: str) -> Iterator[None]:
    """The model's attention is the registered `name` for the block (around the backward too where gradient
    checkpointing reruns layers); nested blocks of the same name are one."""
    current = module.config._attn_implementation
    if current == name:
        yield
        return
    module.set_attn_implementation(name)
    _base_of_mode[id(module)] = current
    try:
        yield
    finally:
        module.set_attn_implementation(current)
        del _base_of_mode[id(module)]


def own_attention(module: nn.Module) -> str:
    """The model's own attention, also inside an `attention_mode` block."""
    return _base_of_mode.get(id(module), module.config._attn_implementation)


def shared_prompt_mode(module: nn.Module) -> contextlib.AbstractContextManager[None]:
    """`attention_mode` for `SHARED_PROMPT`: every forward in it must be `shared_prompt_forward`."""
    return attention_mode(module, SHARED_PROMPT)


@functools.cache
def forward_takes(module_class: type, keyword: str) -> bool:
    """Whether `module_class.forward` has a parameter named `keyword`."""
    return keyword in inspect.signature(module_class.forward).parameters


def head_on_kept_positions(module: nn.Module, keep: torch.Tensor | int) -> tuple[dict, Callable]:
    """(extra forward kwargs, a function of the output's logits) giving the head's outputs at `keep` only (a
    count of last columns, or column indices), by `logits_to_keep` where the head takes it."""
    if forward_takes(type(module), "logits_to_keep"):
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
    """What a padded forward over `input_ids` (B, response_start + response_kept) gives at the kept response
    positions, (B, response_kept, vocab or labels), computing each distinct prompt once. `prompt_of_row` (B,)
    numbers each row's prompt; `unique_rows` (U,) is one row holding each distinct prompt."""
    if response_kept < 1:
        raise ValueError("shared_prompt_forward needs at least one response column")
    p, r = response_start, response_kept
    rows, u = input_ids.shape[0], unique_rows.shape[0]
    base = own_attention(module)
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
