"""`rollout.name=hf`: batched sampling with a KV cache over a Hugging Face causal LM (CPU and GPU).

The engine calls the module's forward itself instead of `model.generate`, so it works on whatever
the worker hands it (a plain `PreTrainedModel` or an FSDP2-wrapped one whose parameters the worker
has gathered) and it can do three things `generate` does not:

- prefill each prompt once and copy its KV cache n times (`generate` prefills all B*n rows), without
  the padding columns every prompt of the batch shares (`micro_batch.trim_columns`, as the actor's passes
  trim theirs): datasets pad to `data.max_prompt_length`, often far beyond a batch's longest prompt;
- keep keys/values in a cache preallocated for prompt + response and written in place
  (`kv_cache.PreallocatedCache`), where `generate`'s `DynamicCache` re-copies the whole cache with
  `torch.cat` on every step (on a CPU attention reads its whole contiguous buffers, masked);
- drop finished rows from the batch and the cache once an eighth of the batch has finished, so they
  stop costing compute (dropping copies the survivors' cache, so it is batched rather than per row);
- run in `rollout.dtype` on a copy of the weights cast once per call (autocast would re-cast
  activations around every matmul, which measured slower than the copy);
- decode with the attention that is fastest in that dtype (`attention_for_decoding`: grouped eager on
  a CPU in half precision, where torch's fused CPU kernel is slow for one query token, and sdpa
  elsewhere, reading each key/value head of the cache in place);
- call an FSDP-wrapped actor's layers without FSDP's per-layer hooks (`decoding_module`: the parameters
  are gathered once for the whole generation, so the hooks have nothing to do at each step);
- on an x86 CPU, run every linear layer on a copy of its weight reordered once per call for oneDNN
  (`packed_linear.prepacked_linears`; bf16: the same outputs bit for bit; fp32: oneDNN's sums in place of
  MKL's; generations faster in both, measured: benchmarks/results/packed_linear.md);
- on a CPU, run each step after the prefill of a Llama-family model (Llama, Qwen2, Mistral) through
  `fused_decoder.FusedDecoder`: the model's own modules and weights with stacked q/k/v and gate/up
  projections and one mask per step for all layers; the same logits bit for bit with less work around
  each layer (measured: benchmarks/results/fused_decode.md); other models step through their forward;
- and there, for n > 1 samples of prompts at least `SHARE_PROMPT_KV_FROM` columns long, keep each prompt's
  keys/values once for all its samples (`fused_decoder.SharedPromptKV`): attention reads a prompt's cache
  once per step instead of n times (measured: benchmarks/results/fused_decode.md);
- stop as soon as every row has finished, and return the sampler's log-probs for free;
- on a GPU, unless `rollout.enforce_eager=true`, replay each decoding step as a CUDA graph
  (`static_decode`: fixed shapes, no row dropping), since there a step's time is kernel launches.

Measured against `model.generate` in benchmarks/rollout_bench.py (results in benchmarks/results/).

One decoding step is one forward over the active rows plus a few tensor ops on their logits; no
per-row Python runs inside the loop.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import Cache, DynamicCache

from hybridrl.models.attention import GROUPED_EAGER, GROUPED_SDPA, decoding_attention
from hybridrl.models.loading import resolve_dtype
from hybridrl.models.onednn_linear import prepacked_linears
from hybridrl.protocol import DataProto
from hybridrl.utils.typed_config import to_dataclass
from hybridrl.workers.config import RolloutConfig
from hybridrl.workers.micro_batch import trim_columns
from hybridrl.workers.rollout.base import (
    ROLLOUT_ENGINES,
    BaseRollout,
    ServedActor,
    assemble_output,
    check_prompts,
    eos_token_ids,
)
from hybridrl.workers.rollout.fused_decoder import (
    FusedDecoder,
    SharedPromptKV,
    fused_decoder,
    unsupported_reason,
)
from hybridrl.workers.rollout.kv_cache import PreallocatedCache, cache_keyword
from hybridrl.workers.rollout.sampling import (
    DecodeOutputs,
    SamplingParams,
    resolve_sampling_params,
    sample_tokens,
)
from hybridrl.workers.rollout.static_decode import decode_static, hook_free_view

logger = logging.getLogger(__name__)

# Finished rows leave the batch once they are at least this share of it. Dropping copies every
# surviving row's cache; waiting for a batch of finished rows costs a little wasted compute instead.
# Dropping at every finish measured slower than waiting, and any share from 1/16 to 1/4 about alike.
DROP_FINISHED_SHARE = 0.125

# Prompts (their columns after trimming the padding all share) at least this long keep their keys/values
# once for their samples while decoding (fused_decoder.SharedPromptKV); below it the extra regrouping costs
# more than the prompt's share of the attention, and above it sharing gains more the longer the prompt
# (measured: benchmarks/results/fused_decode.md).
SHARE_PROMPT_KV_FROM = 32


@ROLLOUT_ENGINES.register("hf")
class HFRollout(BaseRollout):
    """Generate with a causal LM's forward and a preallocated KV cache.

    Args:
        module: the causal LM (its forward must accept a cache (`cache` or `past_key_values`), `position_ids`,
            `logits_to_keep`, as every transformers causal LM does). The engine reads its weights in
            place: updating the module updates the rollout.
        config: `actor_rollout_ref.rollout.*` (a RolloutConfig, dict or OmegaConf node).
        tokenizer: gives the pad id and EOS id unless they are passed explicitly.
        eos_token_id / pad_token_id: explicit ids; EOS may be a list.
    """

    # with the fused decoder, n > 1 and prompts at least this long, keep each prompt's keys/values once for
    # its samples (SharedPromptKV); None: never
    share_prompt_kv_from: int | None = SHARE_PROMPT_KV_FROM

    def __init__(
        self,
        module: nn.Module,
        config: RolloutConfig | Mapping[str, Any],
        tokenizer: Any = None,
        *,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
    ) -> None:
        self.module = module
        self.config = config = to_dataclass(RolloutConfig, config)
        if eos_token_id is None:
            generation_config = getattr(module, "generation_config", None)
            self.eos_token_ids = eos_token_ids(
                getattr(tokenizer, "eos_token_id", None), getattr(generation_config, "eos_token_id", None)
            )
        else:
            self.eos_token_ids = eos_token_ids(eos_token_id)
        if pad_token_id is None:
            pad_token_id = getattr(tokenizer, "pad_token_id", None)
        if pad_token_id is None:
            pad_token_id = self.eos_token_ids[0] if self.eos_token_ids else None
        if pad_token_id is None:
            raise ValueError("HFRollout needs a pad id: pass pad_token_id= or a tokenizer with a pad/EOS token")
        self.pad_token_id = int(pad_token_id)
        self.dtype = resolve_dtype(config.dtype)
        self.generator = torch.Generator(device=self._device()).manual_seed(config.seed)

    @classmethod
    def build(
        cls,
        config: RolloutConfig,
        *,
        module: nn.Module | None,
        tokenizer: Any,
        model_path: str | Path | None,
    ) -> HFRollout:
        if module is None:
            raise ValueError("rollout.name=hf generates with the actor's module; build it with module=...")
        return cls(module, config, tokenizer)

    def _device(self) -> torch.device:
        return next(self.module.parameters()).device

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy full weights into the module (only needed when the engine holds its own copy)."""
        self.module.load_state_dict(dict(state_dict), strict=True)

    @contextlib.contextmanager
    def _serve_weights(self, actor: ServedActor) -> Iterator[None]:
        """The actor's own module, its parameters gathered once for the whole block (no copy)."""
        if actor.module is not self.module:
            raise ValueError(
                "rollout.name=hf generates with the actor's module in place; build the engine with "
                "module=actor.module to serve that actor"
            )
        with actor.summon_full_params():
            yield

    @contextlib.contextmanager
    def _generation_mode(self) -> Iterator[None]:
        """eval mode, no autograd, and the weights in rollout.dtype for the duration."""
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad(), weights_in_dtype(self.module, self.dtype), \
                    attention_for_decoding(self.module, self.dtype):
                yield
        finally:
            self.module.train(was_training)

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        input_ids, attention_mask, position_ids = check_prompts(prompts)
        params = resolve_sampling_params(self.config, prompts.meta_info, self.eos_token_ids)
        generator = self.generator
        if params.seed is not None:
            generator = torch.Generator(device=input_ids.device).manual_seed(params.seed)
        # the output keeps the prompts as given; only the decoding skips their shared padding (prompts are
        # left-padded, check_prompts: every row's last column is kept, and position ids are each row's own)
        trimmed = trim_columns(prompts, response_length=0)
        input_ids, attention_mask, position_ids = trimmed.input_ids, trimmed.attention_mask, trimmed.position_ids
        with self._generation_mode():
            responses, lengths, log_probs = self._decode(
                input_ids, attention_mask, position_ids, params, generator
            )
        return assemble_output(prompts, responses, lengths, log_probs, params.n)

    def _full_attention(self) -> bool:
        """A plain decoder whose every layer attends to every earlier position (no sliding windows)."""
        config = getattr(self.module, "config", None)
        layer_types = getattr(config, "layer_types", None) or ["full_attention"]
        return getattr(config, "num_hidden_layers", None) is not None and \
            all(t == "full_attention" for t in layer_types)

    def _graphed_decoding(self) -> bool:
        """On a GPU, unless `enforce_eager=true`: decode with `static_decode` and a CUDA graph per step. On
        a CPU the eager loop stays (it drops finished rows, and there are no launches to save)."""
        return self.config.enforce_eager is not True and self._device().type == "cuda" and self._full_attention()

    def _new_cache(self, max_len: int) -> Cache:
        """A preallocated cache for plain full-attention decoders, transformers' own otherwise."""
        if not self._full_attention():
            return DynamicCache()
        # On a CPU attention reads the whole buffers: strided prefix views cost a copy in torch's CPU
        # batched matmul (kv_cache's docstring has the measurements); elsewhere it reads the prefix.
        return PreallocatedCache(self.module.config.num_hidden_layers, max_len,
                                 full_width=self._device().type == "cpu")

    def _forward(self, model: nn.Module, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 cache: Cache) -> torch.Tensor:
        """Next-token logits (rows, vocab) for the last column of `input_ids`, appending to `cache`."""
        out = model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            **{cache_keyword(model): cache},
            use_cache=True,
            logits_to_keep=1,  # only the last position's logits: the prefill skips P-1 vocab projections
        )
        return out.logits[:, -1, :]

    def _decode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The sampling loop. Returns responses (B*n, R), lengths (B*n,), log-probs (B*n, R)."""
        if self._graphed_decoding():
            return decode_static(self.module, input_ids, attention_mask, position_ids, params, generator,
                                 self.pad_token_id, self.dtype, capture=input_ids.device.type == "cuda")
        model = decoding_module(self.module)
        # the weights stay as they are for the whole call: on a CPU each linear's is packed once
        with prepacked_linears(model):
            decoder = fused_decoder(model) if self._device().type == "cpu" and self._full_attention() else None
            self._log_decoding_path(model, decoder)
            return self._decode_eagerly(model, input_ids, attention_mask, position_ids, params, generator, decoder)

    def _log_decoding_path(self, model: nn.Module, decoder: FusedDecoder | None) -> None:
        """Say once per engine which step the eager loop runs, and why not the fused one."""
        if getattr(self, "_decoding_path_logged", False):
            return
        self._decoding_path_logged = True
        name = type(model).__name__
        if decoder is not None:
            sharing = "never" if self.share_prompt_kv_from is None else f"from {self.share_prompt_kv_from} columns"
            logger.info("HF rollout: %s decodes with the fused step (prompts' keys/values kept once for their "
                        "samples %s)", name, sharing)
        elif self._device().type != "cpu":
            logger.info("HF rollout: %s decodes with its forward (the fused step is for CPUs)", name)
        else:
            reason = unsupported_reason(model) if self._full_attention() else "layers other than full attention"
            logger.info("HF rollout: %s decodes with its forward, not the fused step: %s", name, reason)

    def _decode_eagerly(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator,
        decoder: FusedDecoder | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The eager sampling loop over `model` (`decoding_module`'s), dropping finished rows. The prompts
        are prefilled by the model's forward; each later step by `decoder` where given (`fused_decoder`: the
        same logits with less around them; over each prompt's keys/values kept once for its samples when
        n > 1 and the prompts reach `share_prompt_kv_from` columns), else by the model's forward too."""
        n, width = params.n, params.response_length
        rows, prompt_len = input_ids.shape[0] * n, input_ids.shape[1]
        device = input_ids.device
        # With the fused decoder, each prompt's keys/values stay once for its n samples (SharedPromptKV);
        # otherwise each sample gets a copy of its prompt's.
        shared = decoder is not None and n > 1 and self.share_prompt_kv_from is not None \
            and prompt_len >= self.share_prompt_kv_from
        cache = self._new_cache(prompt_len + (0 if shared else width))
        # Prefill each prompt once.
        logits = self._forward(model, input_ids, attention_mask, position_ids, cache)  # (B, V)
        kv = SharedPromptKV(cache, attention_mask, n, width, logits.dtype) if shared else None
        if n > 1:
            if not shared:
                cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)  # (B*n, V)
        # The full mask of every row's prompt + response; step t attends to its first P+t+1 columns.
        mask = torch.cat(
            [attention_mask.repeat_interleave(n, dim=0), attention_mask.new_ones(rows, width)], dim=1
        )  # (B*n, P+R)
        next_position = position_ids[:, -1].repeat_interleave(n) + 1  # (B*n,)
        out = DecodeOutputs.allocate(rows, width, params, self.pad_token_id, input_ids.dtype, device)
        active = torch.arange(rows, device=device)  # output row of each row still in the batch
        finished = torch.zeros(rows, dtype=torch.bool, device=device)  # stopped, not yet dropped
        for step in range(width):
            tokens, token_log_probs = sample_tokens(logits, params, generator)  # (A,), (A,)
            out.record(active, step, tokens, token_log_probs)
            if step == width - 1:
                break
            done = out.is_stop(tokens) & ~finished  # (A,) rows stopping at this step
            if bool(done.any()):
                out.lengths[active[done]] = step + 1  # the stop token itself is part of the response
                finished |= done
                stopped = int(finished.sum())
                if stopped == finished.numel():
                    break
                if stopped >= DROP_FINISHED_SHARE * finished.numel():
                    # Finished rows leave the batch and the cache, so later steps skip them.
                    keep = torch.nonzero(~finished).squeeze(1)  # (A',)
                    if shared:
                        kv.select(keep)
                    else:
                        cache.batch_select_indices(keep)
                    active, tokens, mask, next_position = active[keep], tokens[keep], mask[keep], next_position[keep]
                    finished = finished[keep]
            seen = mask[:, : prompt_len + step + 1]  # (A, P+step+1): the prompt, the response so far, this token
            if shared:
                logits = decoder.step_shared(tokens, next_position, kv)  # (A, V)
            elif decoder is not None:
                logits = decoder.step(tokens, next_position, cache, seen)  # (A, V)
            else:
                logits = self._forward(model, tokens[:, None], seen, next_position[:, None], cache)  # (A, V)
            next_position = next_position + 1
        return out.finish()


def decoding_module(module: nn.Module) -> nn.Module:
    """What the eager loop calls: for an FSDP2-wrapped module (parameters gathered by the caller), a view
    of it without FSDP's hooks (`static_decode.hook_free_view`); any other module as it is.

    With the parameters already gathered for the whole generation, FSDP's pre/post-forward hooks on every
    wrapped layer find nothing to do, but they still run at every step, and with them the FSDP-wrapped
    model measured slower than the same model unwrapped.
    """
    from torch.distributed.fsdp import FSDPModule

    if any(isinstance(m, FSDPModule) for m in module.modules()):
        return hook_free_view(module)
    return module


@contextlib.contextmanager
def attention_for_decoding(module: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """For the block, the attention that decodes fastest in `dtype` here (`decoding_attention`): grouped
    eager on a CPU in bf16/fp16, sdpa elsewhere, in its grouped form (no copies of the cache's key/value
    heads, whatever the transformers version); the model's own setting (the one its training passes use)
    comes back when the block ends. Models other than transformers' sdpa/eager ones are left alone.

    Decoding one query token per step, torch's CPU sdpa kernel is slow in bf16 when no prompt is padded
    (slower than in fp32), and grouped eager measured the fastest in bf16 with or without padded prompts.
    """
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


@contextlib.contextmanager
def weights_in_dtype(module: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Swap every floating parameter's data for a copy in `dtype`, and put the originals back after.

    The Parameter objects stay the same (the optimizer and FSDP keep their references), and the
    originals come back bit for bit. Buffers are left alone: rotary `inv_freq` stays fp32 as in a model
    loaded in bf16. Tied weights are one Parameter, so they are cast once and stay tied.
    """
    originals: list[tuple[nn.Parameter, torch.Tensor]] = []
    try:
        for param in module.parameters():
            if param.is_floating_point() and param.dtype != dtype:
                originals.append((param, param.data))
                param.data = param.data.to(dtype)
        yield
    finally:
        for param, data in originals:
            param.data = data
