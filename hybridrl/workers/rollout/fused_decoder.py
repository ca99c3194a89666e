"""One decoding step of a Llama-family causal LM over the model's own weights, for the HF engine's eager loop on
a CPU: the forward's logits bit for bit, with stacked q/k/v and gate/up projections and one rotary pass and mask
per step (docs/rollout.md, "How the HF engine decodes").
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from hybridrl.models.attention import GROUPED_EAGER, GROUPED_SDPA, additive
from hybridrl.models.onednn_linear import FixedLinear, is_plain_linear
from hybridrl.workers.rollout.kv_cache import ForwardSteps, PreallocatedCache, forward_logits

FUSED_MODEL_TYPES = ("llama", "mistral", "qwen2")
# attention implementations by the kind of mask they take: additive float, or boolean (True = attend)
ADDITIVE_MASK_ATTENTION = ("eager", GROUPED_EAGER)
BOOLEAN_MASK_ATTENTION = ("sdpa", GROUPED_SDPA)


def _stacked(linears: list[nn.Linear]) -> FixedLinear:
    """One linear whose output is the outputs of `linears` side by side."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    if all(lin.bias is None for lin in linears):
        return FixedLinear(weight, None)
    return FixedLinear(weight, torch.cat([weight.new_zeros(lin.out_features) if lin.bias is None else lin.bias.detach()
                                          for lin in linears]))


def unsupported_reason(model: nn.Module) -> str | None:
    """Why `model` cannot decode with `FusedDecoder` (None: it can)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in FUSED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {FUSED_MODEL_TYPES}"
    if getattr(config, "_attn_implementation", None) not in ADDITIVE_MASK_ATTENTION + BOOLEAN_MASK_ATTENTION:
        return f"attention implementation {getattr(config, '_attn_implementation', None)!r}"
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return "a sliding window"
    base = getattr(model, "model", None)
    if not (isinstance(getattr(base, "layers", None), nn.ModuleList) and is_plain_linear(getattr(model, "lm_head", None))
            and isinstance(getattr(base, "embed_tokens", None), nn.Embedding)
            and all(hasattr(base, name) for name in ("norm", "rotary_emb"))):
        return "not a (model.layers, lm_head) causal LM"
    for layer in base.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        projections = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")] \
            + [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if not all(is_plain_linear(p) for p in projections):
            return "a projection that is not a plain nn.Linear (a LoRA or quantized layer?)"
        if getattr(attn, "sliding_window", None) is not None:
            return "a sliding window"
    return None


class FusedDecoder:
    """Next-token logits for one new token per row, over `model`'s weights as they are at construction (build one
    per generation, after the weights are gathered and cast)."""

    def __init__(self, model: nn.Module) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"FusedDecoder cannot decode this model: {reason}")
        config = model.config
        self.model, self.base = model, model.model
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.attention = ALL_ATTENTION_FUNCTIONS[config._attn_implementation]
        self.additive_mask = config._attn_implementation in ADDITIVE_MASK_ATTENTION
        attns, mlps = [layer.self_attn for layer in self.base.layers], [layer.mlp for layer in self.base.layers]
        self.qkv: list[FixedLinear] = [_stacked([attn.q_proj, attn.k_proj, attn.v_proj]) for attn in attns]
        self.gate_up: list[FixedLinear] = [_stacked([mlp.gate_proj, mlp.up_proj]) for mlp in mlps]

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, cache: object,
             attention_mask: torch.Tensor) -> torch.Tensor:
        """tokens (A,), positions (A,), a transformers Cache holding the prefilled prompts, the rows' 0/1 mask over
        the written positions and this one (A, W) -> logits (A, V)."""
        kv_length = cache.layers[0].get_mask_sizes(1)[0]
        # (A, 1, 1, kv_length) of the attention's kind; past W: masked
        mask = F.pad(attention_mask.bool(), (0, kv_length - attention_mask.shape[1]))[:, None, None, :]
        if self.additive_mask:
            mask = additive(mask, self.base.embed_tokens.weight.dtype)

        def attend(attn: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            keys, values = cache.update(key[:, :, None], value[:, :, None], attn.layer_idx)  # (A, KVH, W, D)
            out, _ = self.attention(attn, query[:, :, None], keys, values, mask, dropout=0.0, scaling=attn.scaling)
            return out  # (A, 1, H, D)

        return self._layers(tokens, positions, attend)

    def step_shared(self, tokens: torch.Tensor, positions: torch.Tensor, kv: SharedPromptKV) -> torch.Tensor:
        """`step` for the rows of `kv.active`, over their prompts' keys/values kept once -> logits (A, V)."""
        mask = kv.step_mask()  # (A, 1, 1, P + W)
        prompt_len, group = kv.prompt_len, self.heads // self.kv_heads

        def attend(attn: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
            prompt = kv.prompt.layers[attn.layer_idx]  # (B, KVH, P, D) keys and values
            # query heads g*R .. g*R+R-1 share key/value head g (R = group)
            query = query.reshape(query.shape[0], self.kv_heads, group, self.head_dim)  # (A, KVH, R, D)
            keys, values = kv.responses.update(key[:, :, None], value[:, :, None], attn.layer_idx)  # (A, KVH, W, D)
            prompt_scores = kv.by_row(torch.matmul(kv.by_prompt(query), prompt.keys.transpose(2, 3)))
            scores = torch.cat([prompt_scores, torch.matmul(query, keys.transpose(2, 3))], dim=-1)
            scores = scores * attn.scaling + mask  # (A, KVH, R, P + W)
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
            return torch.matmul(probs[..., prompt_len:], values) \
                + kv.by_row(torch.matmul(kv.by_prompt(probs[..., :prompt_len]), prompt.values))  # (A, KVH, R, D)

        return self._layers(tokens, positions, attend)

    def _layers(self, tokens: torch.Tensor, positions: torch.Tensor,
                attend: Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The model over one token per row; `attend(self_attn, query (A, H, D), key (A, KVH, D), value (A, KVH, D))`
        gives each layer's attention output (A*H*D elements, heads in order)."""
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        rows = tokens.shape[0]
        x = self.base.embed_tokens(tokens)  # (A, hidden)
        cos, sin = self.base.rotary_emb(x, positions[:, None])  # (A, 1, D) each
        half = head_dim // 2
        for layer, qkv_proj, gate_up_proj in zip(self.base.layers, self.qkv, self.gate_up, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            qkv = qkv_proj(layer.input_layernorm(x)).view(rows, heads + 2 * kv_heads, head_dim)
            qk = qkv[:, : heads + kv_heads]  # queries and keys take the rotary embedding, values do not
            rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
            qk = qk * cos + rotated * sin  # (A, H + KVH, D)
            out = attend(attn, qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads:])
            x = x + attn.o_proj(out.reshape(rows, heads * head_dim))
            gate, up = gate_up_proj(layer.post_attention_layernorm(x)).chunk(2, dim=-1)
            x = x + mlp.down_proj(mlp.act_fn(gate) * up)
        return self.model.lm_head(self.base.norm(x))  # (A, V)


class SharedPromptKV:
    """Keys/values of B prompts kept once each, each sample's response in its own row, and which samples still
    decode: attention reads a prompt's keys/values once for its n samples in one matmul."""

    def __init__(self, prompt: PreallocatedCache, prompt_mask: torch.Tensor, n: int, width: int,
                 dtype: torch.dtype) -> None:
        """prompt: the cache the B prompts were prefilled into, exactly P wide; prompt_mask (B, P) 0/1; width: the
        most response tokens a row can write."""
        self.prompt, self.n = prompt, n
        self.prompts, self.prompt_len = prompt_mask.shape
        widths = {layer.keys.shape[2] for layer in prompt.layers}
        if widths != {self.prompt_len}:
            raise ValueError(f"SharedPromptKV needs the prompt cache exactly as wide as the prompts ({self.prompt_len} "
                             f"columns); its layers are {sorted(widths)} wide: build it with max_len=prompt length")
        self.responses = PreallocatedCache(len(prompt.layers), width, full_width=True)
        self.active = torch.arange(self.prompts * n, device=prompt_mask.device)  # sample index of each row
        self.min_value = torch.finfo(dtype).min
        self.prompt_mask = additive(prompt_mask != 0, dtype).repeat_interleave(n, dim=0)  # (A, P), a row per sample

    def select(self, keep: torch.Tensor) -> None:
        """Only the rows `keep` (indices into the current rows) go on decoding."""
        self.active = self.active[keep]
        self.prompt_mask = self.prompt_mask[keep]
        self.responses.batch_select_indices(keep)

    def step_mask(self) -> torch.Tensor:
        """(A, 1, 1, P + W) additive mask over each row's prompt padding and the response positions not written."""
        written = self.responses.layers[0].length + 1
        width = self.responses.layers[0].get_mask_sizes(1)[0]
        response = self.prompt_mask.new_full((1, width), self.min_value)
        response[:, :written] = 0
        return torch.cat([self.prompt_mask, response.expand(self.prompt_mask.shape[0], width)],
                         dim=1)[:, None, None, :]

    def by_prompt(self, x: torch.Tensor) -> torch.Tensor:
        """(A, KVH, R, X) per row -> (B, KVH, n*R, X), each prompt's samples stacked (rows that left are zeros)."""
        rows, kv_heads, group, size = x.shape
        if rows != self.prompts * self.n:
            padded = x.new_zeros(self.prompts * self.n, kv_heads, group, size)
            x = padded.index_copy_(0, self.active, x)
        return x.reshape(self.prompts, self.n, kv_heads, group, size).transpose(1, 2) \
            .reshape(self.prompts, kv_heads, self.n * group, size)

    def by_row(self, y: torch.Tensor) -> torch.Tensor:
        """The inverse of `by_prompt`: (B, KVH, n*R, X) -> (A, KVH, R, X) for the rows still decoding."""
        prompts, kv_heads, stacked, size = y.shape
        y = y.reshape(prompts, kv_heads, self.n, stacked // self.n, size).transpose(1, 2) \
            .reshape(prompts * self.n, kv_heads, stacked // self.n, size)
        return y if y.shape[0] == self.active.numel() else y.index_select(0, self.active)


def fused_decoder(model: nn.Module) -> FusedDecoder | None:
    """`FusedDecoder(model)` where it applies, else None."""
    return FusedDecoder(model) if unsupported_reason(model) is None else None


class SharedPromptSteps(ForwardSteps):
    """`FusedDecoder.step_shared` over `SharedPromptKV`; `cache` holds the prompts only."""

    def __init__(self, decoder: FusedDecoder, cache: Cache, width: int) -> None:
        super().__init__(decoder.model, cache, decoder)
        self.width = width

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                n: int) -> torch.Tensor:
        logits = forward_logits(self.model, input_ids, attention_mask, position_ids, self.cache)  # (B, V)
        self.kv = SharedPromptKV(self.cache, attention_mask, n, self.width, logits.dtype)
        return logits.repeat_interleave(n, dim=0)

    def select(self, keep: torch.Tensor) -> None:
        self.kv.select(keep)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        return self.decoder.step_shared(tokens, positions, self.kv)
