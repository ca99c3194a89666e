"""`rollout.name=hf`: batched sampling with a KV cache over a Hugging Face causal LM (CPU and GPU).

The engine calls the module's forward itself instead of `model.generate`, so it works on whatever
the worker hands it (a plain `PreTrainedModel` or an FSDP2-wrapped one whose parameters the worker
has gathered) and it can do three things `generate` does not:

- prefill each prompt once and copy its KV cache n times (`generate` prefills all B*n rows);
- drop finished rows from the batch and the cache, so they stop costing compute;
- stop as soon as every row has finished, and return the sampler's log-probs for free.

One decoding step is one forward over the active rows plus a few tensor ops on their logits; no
per-row Python runs inside the loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache

from hybridrl.models.loading import resolve_dtype
from hybridrl.protocol import DataProto
from hybridrl.workers.config import to_dataclass
from hybridrl.workers.rollout.base import (
    ROLLOUT_ENGINES,
    BaseRollout,
    assemble_output,
    check_prompts,
    eos_token_ids,
)
from hybridrl.workers.rollout.config import RolloutConfig
from hybridrl.workers.rollout.sampling import SamplingParams, resolve_sampling_params, sample_tokens


@ROLLOUT_ENGINES.register("hf")
class HFRollout(BaseRollout):
    """Generate with a causal LM's forward and a `DynamicCache`.

    Args:
        module: the causal LM (its forward must accept `past_key_values`, `position_ids`,
            `logits_to_keep`, as every transformers causal LM does). The engine reads its weights in
            place: updating the module updates the rollout.
        config: `actor_rollout_ref.rollout.*` (a RolloutConfig, dict or OmegaConf node).
        tokenizer: gives the pad id and EOS id unless they are passed explicitly.
        eos_token_id / pad_token_id: explicit ids; EOS may be a list.
    """

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
    def _generation_mode(self) -> Iterator[None]:
        """eval mode, no autograd, and autocast when rollout.dtype differs from the weights' dtype."""
        was_training = self.module.training
        self.module.eval()
        device = self._device()
        weights_dtype = next(self.module.parameters()).dtype
        autocast = (
            torch.autocast(device_type=device.type, dtype=self.dtype)
            if weights_dtype != self.dtype
            else contextlib.nullcontext()
        )
        try:
            with torch.no_grad(), autocast:
                yield
        finally:
            self.module.train(was_training)

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        input_ids, attention_mask, position_ids = check_prompts(prompts)
        params = resolve_sampling_params(self.config, prompts.meta_info, self.eos_token_ids)
        generator = self.generator
        if params.seed is not None:
            generator = torch.Generator(device=input_ids.device).manual_seed(params.seed)
        with self._generation_mode():
            responses, lengths, log_probs = self._decode(
                input_ids, attention_mask, position_ids, params, generator
            )
        return assemble_output(prompts, responses, lengths, log_probs, params.n)

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 cache: DynamicCache) -> torch.Tensor:
        """Next-token logits (rows, vocab) for the last column of `input_ids`, appending to `cache`."""
        out = self.module(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
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
        n, width = params.n, params.response_length
        rows, prompt_len = input_ids.shape[0] * n, input_ids.shape[1]
        device = input_ids.device
        cache = DynamicCache()
        # Prefill each prompt once, then give each of its n samples a copy of the cache.
        logits = self._forward(input_ids, attention_mask, position_ids, cache)  # (B, V)
        if n > 1:
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)  # (B*n, V)
        # The full mask of every row's prompt + response; step t attends to its first P+t+1 columns.
        mask = torch.cat(
            [attention_mask.repeat_interleave(n, dim=0), attention_mask.new_ones(rows, width)], dim=1
        )  # (B*n, P+R)
        next_position = position_ids[:, -1].repeat_interleave(n) + 1  # (B*n,)
        responses = torch.full((rows, width), self.pad_token_id, dtype=input_ids.dtype, device=device)
        log_probs = torch.zeros(rows, width, dtype=torch.float32, device=device)
        lengths = torch.full((rows,), width, dtype=torch.long, device=device)
        stop_ids = torch.tensor(params.stop_token_ids, dtype=input_ids.dtype, device=device)
        active = torch.arange(rows, device=device)  # output row of each row still in the batch
        for step in range(width):
            tokens, token_log_probs = sample_tokens(logits, params, generator)  # (A,), (A,)
            responses[active, step] = tokens
            log_probs[active, step] = token_log_probs
            if step == width - 1:
                break
            done = torch.isin(tokens, stop_ids)  # (A,)
            if bool(done.any()):
                lengths[active[done]] = step + 1  # the stop token itself is part of the response
                keep = torch.nonzero(~done).squeeze(1)  # (A',)
                if keep.numel() == 0:
                    break
                # Finished rows leave the batch and the cache, so later steps skip them entirely.
                cache.batch_select_indices(keep)
                active, tokens, mask, next_position = active[keep], tokens[keep], mask[keep], next_position[keep]
            logits = self._forward(
                tokens[:, None], mask[:, : prompt_len + step + 1], next_position[:, None], cache
            )  # (A, V)
            next_position = next_position + 1
        return responses, lengths, log_probs
