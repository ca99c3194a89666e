"""`rollout.name=hf`: batched sampling with a KV cache over the actor's own Hugging Face causal LM (CPU and
GPU). `decode_eagerly` is the reference loop; `HFRollout._decode` alone chooses the faster paths, each tested
equal to it (docs/rollout.md, "How the HF engine decodes").
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import Cache, DynamicCache

from hybridrl.models.attention import attention_for_decoding
from hybridrl.models.loading import resolve_dtype, weights_in_dtype
from hybridrl.models.lora import merged_for_generation
from hybridrl.models.onednn_linear import prepacked_linears
from hybridrl.protocol import DataProto
from hybridrl.utils.cpu_threads import fit_cpu_threads
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
from hybridrl.workers.rollout.continuous import ContinuousBatch
from hybridrl.workers.rollout.fused_decoder import (
    FusedDecoder,
    SharedPromptSteps,
    fused_decoder,
    unsupported_reason,
)
from hybridrl.workers.rollout.kv_cache import ForwardSteps, PreallocatedCache
from hybridrl.workers.rollout.sampling import (
    DecodeOutputs,
    SamplingParams,
    resolve_sampling_params,
    sample_tokens,
)
from hybridrl.workers.rollout.static_decode import decode_static, decoding_module

logger = logging.getLogger(__name__)

# Finished rows leave the batch once they are this share of it: dropping copies the survivors' cache.
DROP_FINISHED_SHARE = 0.125


@ROLLOUT_ENGINES.register("hf")
class HFRollout(BaseRollout):
    """Generate with `module` in place (updating it updates the rollout); `tokenizer` gives the pad and EOS ids
    unless `eos_token_id` (an int or a list) / `pad_token_id` are given."""

    # fused step, n > 1: prompts this long keep their keys/values once for their samples (None: never)
    share_prompt_kv_from: int | None = 32

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
            self.eos_token_ids = eos_token_ids(getattr(tokenizer, "eos_token_id", None),
                                               getattr(generation_config, "eos_token_id", None))
        else:
            self.eos_token_ids = eos_token_ids(eos_token_id)
        pads = (pad_token_id, getattr(tokenizer, "pad_token_id", None), *self.eos_token_ids[:1])
        pad_token_id = next((pad for pad in pads if pad is not None), None)
        if pad_token_id is None:
            raise ValueError("HFRollout needs a pad id: pass pad_token_id= or a tokenizer with a pad/EOS token")
        self.pad_token_id = int(pad_token_id)
        self.dtype = resolve_dtype(config.dtype)
        self.generator = torch.Generator(device=self._device()).manual_seed(config.seed)
        self.continuous: ContinuousBatch | None = None  # streaming mode's batch, kept across `stream` calls

    @classmethod
    def build(cls, config: RolloutConfig, *, module: nn.Module | None, tokenizer: Any,
              model_path: str | Path | None) -> HFRollout:
        if module is None:
            raise ValueError("rollout.name=hf generates with the actor's module; build it with module=...")
        return cls(module, config, tokenizer)

    def _device(self) -> torch.device:
        return next(self.module.parameters()).device

    def update_weights(self, state_dict: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy full weights into the module in place, one at a time: every weight of the module, and no other."""
        own = self.module.state_dict()
        seen = set()
        with torch.no_grad():
            for name, tensor in (state_dict.items() if isinstance(state_dict, Mapping) else state_dict):
                if name not in own:
                    raise KeyError(f"update_weights: the rollout's model has no weight {name!r}")
                own[name].copy_(tensor)
                seen.add(name)
        missing = sorted(set(own) - seen)
        if missing:
            raise KeyError(f"update_weights: no value came for {len(missing)} of the model's weights, e.g. {missing[:3]}")

    @contextlib.contextmanager
    def _serve_weights(self, actor: ServedActor) -> Iterator[None]:
        """The actor's own module, its parameters gathered for the block (LoRA adapters merged into them)."""
        if actor.module is not self.module:
            raise ValueError("rollout.name=hf generates with the actor's module in place; build the engine with "
                             "module=actor.module to serve that actor")
        with actor.summon_full_params(), merged_for_generation(self.module, in_place=True):
            yield

    @contextlib.contextmanager
    def _generation_mode(self) -> Iterator[None]:
        """eval mode, no autograd, LoRA adapters merged into plain linears and the weights in rollout.dtype."""
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad(), merged_for_generation(self.module), weights_in_dtype(self.module, self.dtype), \
                    attention_for_decoding(self.module, self.dtype):
                yield
        finally:
            self.module.train(was_training)

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        input_ids, attention_mask, position_ids = check_prompts(prompts)
        params = resolve_sampling_params(self.config, prompts.meta_info, self.eos_token_ids)
        seed = params.seed  # a per-call seed restarts the sampler; else the engine's generator goes on
        generator = self.generator if seed is None else torch.Generator(device=input_ids.device).manual_seed(seed)
        # only the decoding skips the prompts' shared padding; the output keeps them as given
        trimmed = trim_columns(prompts, response_length=0)
        input_ids, attention_mask, position_ids = trimmed.input_ids, trimmed.attention_mask, trimmed.position_ids
        with self._generation_mode():
            responses, lengths, log_probs = self._decode(input_ids, attention_mask, position_ids, params, generator)
        return assemble_output(prompts, responses, lengths, log_probs, params.n)

    def stream(self, prompts: DataProto | None, version: int, max_steps: int, min_groups: int = 1,
               partial: bool = True) -> DataProto | None:
        """Streaming mode: queue `prompts` and decode (`ContinuousBatch.run`) under weights `version`."""
        if not self._full_attention():
            raise ValueError("async_training.mode=streaming decodes with a continuous batch, which needs a decoder "
                             "whose every layer attends to all earlier positions; this model has other layers. "
                             "Use async_training.mode=one_step_off or sync")
        if self.continuous is None:
            meta = {} if prompts is None else prompts.meta_info
            params = resolve_sampling_params(self.config, meta, self.eos_token_ids)
            self.continuous = ContinuousBatch(params, self.pad_token_id, self.config.prompt_length,
                                              self.config.max_num_seqs, self.generator, self._device())
        if prompts is not None and len(prompts):
            check_prompts(prompts)
            self.continuous.add(prompts)
        with self._generation_mode(), self._eager_decoder() as (model, decoder):
            return self.continuous.run(model, decoder, version, max_steps, min_groups, partial)

    def _full_attention(self) -> bool:
        """A plain decoder whose every layer attends to every earlier position (no sliding windows)."""
        config = getattr(self.module, "config", None)
        layer_types = getattr(config, "layer_types", None) or ["full_attention"]
        return getattr(config, "num_hidden_layers", None) is not None and \
            all(t == "full_attention" for t in layer_types)

    def _graphed_decoding(self) -> bool:
        """On a GPU, unless `enforce_eager=true`: decode with `static_decode`'s CUDA graphs."""
        return self.config.enforce_eager is not True and self._device().type == "cuda" and self._full_attention()

    def _new_cache(self, max_len: int) -> Cache:
        """A preallocated cache for plain full-attention decoders, transformers' own otherwise."""
        if not self._full_attention():
            return DynamicCache()
        # on a CPU a strided prefix view costs a copy in the batched matmul (kv_cache.py)
        return PreallocatedCache(self.module.config.num_hidden_layers, max_len,
                                 full_width=self._device().type == "cpu")

    def _decode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                params: SamplingParams, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Responses (B*n, R), lengths (B*n,), log-probs (B*n, R), by the decoding path chosen here and only here."""
        if self._graphed_decoding():
            return decode_static(self.module, input_ids, attention_mask, position_ids, params, generator,
                                 self.pad_token_id, self.dtype, capture=input_ids.device.type == "cuda")
        with self._eager_decoder() as (model, decoder):
            prompt_len, width = input_ids.shape[1], params.response_length
            sharing = self.share_prompt_kv_from is not None and prompt_len >= self.share_prompt_kv_from
            if decoder is not None and params.n > 1 and sharing:
                steps = SharedPromptSteps(decoder, self._new_cache(prompt_len), width)
            else:
                steps = ForwardSteps(model, self._new_cache(prompt_len + width), decoder)
            return decode_eagerly(steps, input_ids, attention_mask, position_ids, params, generator, self.pad_token_id)

    @contextlib.contextmanager
    def _eager_decoder(self) -> Iterator[tuple[nn.Module, FusedDecoder | None]]:
        """What both eager loops step with: the module they call and, on a CPU for a model `fused_decoder` supports,
        the fused step over it, every linear packed for the block."""
        model = decoding_module(self.module)
        with prepacked_linears(model):
            decoder = fused_decoder(model) if self._device().type == "cpu" and self._full_attention() else None
            self._log_decoding_path(model, decoder)
            yield model, decoder

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


def decode_eagerly(steps: ForwardSteps, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   position_ids: torch.Tensor, params: SamplingParams, generator: torch.Generator,
                   pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sampling loop, finished rows dropped, over `steps` (`ForwardSteps` or a faster one) -> responses
    (B*n, R), lengths (B*n,), log-probs (B*n, R)."""
    n, width = params.n, params.response_length
    rows, prompt_len = input_ids.shape[0] * n, input_ids.shape[1]
    device = input_ids.device
    logits = steps.prefill(input_ids, attention_mask, position_ids, n)  # (B*n, V)
    mask = torch.cat([attention_mask.repeat_interleave(n, dim=0), attention_mask.new_ones(rows, width)],
                     dim=1)  # (B*n, P+R)
    next_position = position_ids[:, -1].repeat_interleave(n) + 1  # (B*n,)
    out = DecodeOutputs.allocate(rows, width, params, pad_token_id, input_ids.dtype, device)
    active = torch.arange(rows, device=device)  # output row of each row still in the batch
    finished = torch.zeros(rows, dtype=torch.bool, device=device)  # stopped, not yet dropped
    for step in range(width):
        fit_cpu_threads()  # a generation lasts long enough for a neighbour to start or stop during it
        tokens, token_log_probs = sample_tokens(logits, params, generator)  # (A,), (A,)
        out.record(active, step, tokens, token_log_probs)
        if step == width - 1:
            break
        done = torch.isin(tokens, out.stop_ids) & ~finished  # (A,) rows stopping at this step
        if bool(done.any()):
            out.lengths[active[done]] = step + 1  # the stop token itself is part of the response
            finished |= done
            stopped = int(finished.sum())
            if stopped == finished.numel():
                break
            if stopped >= DROP_FINISHED_SHARE * finished.numel():
                keep = torch.nonzero(~finished).squeeze(1)  # (A',)
                steps.select(keep)
                active, tokens, mask, next_position = active[keep], tokens[keep], mask[keep], next_position[keep]
                finished = finished[keep]
        seen = mask[:, : prompt_len + step + 1]  # (A, P+step+1): the prompt, the response so far, this token
        logits = steps.step(tokens, next_position, seen)  # (A, V)
        next_position = next_position + 1
    return out.finish()
