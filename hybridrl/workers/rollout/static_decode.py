"""The HF rollout's decoding loop with static shapes, replayed as a CUDA graph on a GPU (unless
`rollout.enforce_eager=true`: an eager step there is bound by kernel launches). A step touches only fixed
buffers; no row leaves the batch (docs/rollout.md, "How the HF engine decodes").
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache

from hybridrl.models.attention import additive
from hybridrl.workers.rollout.kv_cache import BufferLayer, ForwardSteps, forward_logits
from hybridrl.workers.rollout.sampling import DecodeOutputs, SamplingParams, sample_tokens

logger = logging.getLogger(__name__)

# Steps between asks whether every row has finished: each ask waits for the GPU, stalling the host's queue.
STOP_CHECK_EVERY = 8
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
               "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called", "_backward_hooks",
               "_backward_pre_hooks")


def hook_free_view(module: nn.Module) -> nn.Module:
    """A copy of `module`'s tree holding the same Parameter and buffer objects, with no hooks and, for FSDP2
    modules, the model's own class. Take it while the parameters are gathered (FSDP2 registers them then)."""
    from torch.distributed.fsdp import FSDPModule

    cls = type(module)
    if issubclass(cls, FSDPModule):  # FSDP2 made the class FSDP<Model>(FSDPModule, Model)
        cls = next(c for c in cls.__mro__ if issubclass(c, nn.Module) and not issubclass(c, FSDPModule))
    view = cls.__new__(cls)
    state = dict(module.__dict__)
    state["_parameters"] = dict(module._parameters)
    state["_buffers"] = dict(module._buffers)
    state["_modules"] = {name: None if child is None else hook_free_view(child)
                         for name, child in module._modules.items()}
    for name in _HOOK_DICTS:
        if name in state:
            state[name] = type(state[name])()
    view.__dict__.update(state)
    return view


def decoding_module(module: nn.Module) -> nn.Module:
    """`module`, or for an FSDP2-wrapped one its `hook_free_view`: FSDP's hooks would run every step for nothing."""
    from torch.distributed.fsdp import FSDPModule

    if any(isinstance(m, FSDPModule) for m in module.modules()):
        return hook_free_view(module)
    return module


class SlotLayer(BufferLayer):
    """One layer's keys and values in fixed zeroed buffers (not NaN), written at the owner's `slots`, read whole."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        rows, heads, _, k_dim = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = key_states.new_zeros(rows, heads, self.owner.max_len, k_dim)  # (rows, H, max_len, Dk)
        self.values = value_states.new_zeros(rows, heads, self.owner.max_len, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (rows, H, q, D) states at the q positions in `owner.slots`; return the whole buffers."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys.index_copy_(2, self.owner.slots, key_states)
        self.values.index_copy_(2, self.owner.slots, value_states)
        return self.keys, self.values  # (rows, H, max_len, D)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.max_len, 0

    def get_seq_length(self) -> int:
        return self.owner.length

    def get_max_length(self) -> int:
        return self.owner.max_len


class SlotCache(Cache):
    """A transformers `Cache` of `num_layers` `SlotLayer`s, `max_len` positions each; the next forward writes at
    `slots`, a tensor filled in place so that a captured step writes where it says at replay."""

    def __init__(self, num_layers: int, max_len: int) -> None:
        self.max_len = max_len
        self.length = 0
        self.slots = torch.zeros(0, dtype=torch.long)
        super().__init__(layers=[SlotLayer(self) for _ in range(num_layers)])


def prefill_mask(attention_mask: torch.Tensor, max_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive (B, 1, P, max_len) mask for the prompts (query i sees real prompt tokens j <= i); the dtype's
    min rather than -inf, so a padding query gets a uniform softmax, not NaN."""
    prompt_len = attention_mask.shape[1]
    causal = torch.ones(prompt_len, prompt_len, dtype=torch.bool, device=attention_mask.device).tril()  # (P, P)
    seen = causal[None] & attention_mask.bool()[:, None, :]  # (B, P, P)
    return additive(F.pad(seen, (0, max_len - prompt_len))[:, None], dtype)


def _graphed(run: Callable[[], torch.Tensor], device: torch.device) -> Callable[[], torch.Tensor]:
    """`run` (a step over fixed buffers) recorded once as a CUDA graph -> a function launching it again; `run`
    itself (logged) where its forward cannot be captured."""
    try:
        current = torch.cuda.current_stream(device)
        warmup = torch.cuda.Stream(device)
        warmup.wait_stream(current)
        with torch.cuda.stream(warmup):
            run()  # lazy initialisations (library handles, allocator blocks) happen outside the capture
        current.wait_stream(warmup)
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread (the driver's background reward scoring) may use CUDA during the capture
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            output = run()
    except RuntimeError as error:
        logger.warning("rollout: capturing the decoding step as a CUDA graph failed (%s); this generation "
                       "decodes without one (rollout.enforce_eager=true skips the attempt)", error)
        torch.cuda.synchronize(device)
        return run

    def replay() -> torch.Tensor:
        graph.replay()
        return output

    return replay


def decode_static(
    module: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    pad_token_id: int,
    compute_dtype: torch.dtype,
    capture: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sampling loop over fixed buffers for a full-attention causal LM with its weights in `compute_dtype`,
    under no_grad -> responses (B*n, R), lengths (B*n,), log-probs (B*n, R)."""
    n, width = params.n, params.response_length
    batch, prompt_len = input_ids.shape
    rows, max_len = batch * n, prompt_len + width
    device = input_ids.device
    model = hook_free_view(module)
    cache = SlotCache(module.config.num_hidden_layers, max_len)
    cache.slots = torch.arange(prompt_len, device=device)
    prompt_mask = prefill_mask(attention_mask, max_len, compute_dtype)  # (B, 1, P, max_len)
    logits = ForwardSteps(model, cache).prefill(input_ids, prompt_mask, position_ids, n)  # (B*n, V)
    cache.length = prompt_len
    # the fixed inputs of every step: the token fed, its position, its slot, each row's mask over max_len slots
    step_tokens = torch.zeros(rows, 1, dtype=input_ids.dtype, device=device)
    step_positions = position_ids[:, -1:].repeat_interleave(n, dim=0) + 1  # (B*n, 1)
    cache.slots = torch.zeros(1, dtype=torch.long, device=device)
    # the prompt's last query sees every prompt token and nothing beyond: each step starts from its row
    step_mask = prompt_mask[:, :, -1:].repeat_interleave(n, dim=0)  # (B*n, 1, 1, max_len), a new buffer

    def step() -> torch.Tensor:
        return forward_logits(model, step_tokens, step_mask, step_positions, cache)

    out = DecodeOutputs.allocate(rows, width, params, pad_token_id, input_ids.dtype, device)
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    for t in range(width):
        tokens, token_log_probs = sample_tokens(logits, params, generator)  # (rows,), (rows,)
        out.record(slice(None), t, tokens, token_log_probs)
        if t == width - 1:
            break
        stopping = torch.isin(tokens, out.stop_ids) & ~finished
        # the stop token itself is part of the response; no host sync, unlike indexing by the stopped rows
        out.lengths = torch.where(stopping, t + 1, out.lengths)
        finished |= stopping
        if (t + 1) % STOP_CHECK_EVERY == 0 and bool(finished.all()):
            break
        step_tokens.copy_(tokens[:, None])
        cache.slots.fill_(prompt_len + t)
        step_mask[:, 0, 0, prompt_len + t] = 0.0
        if t > 0:
            step_positions.add_(1)
        if capture:  # the first step is recorded; the later ones launch the recording
            step, capture = _graphed(step, device), False
        logits = step()
        cache.length = prompt_len + t + 1
    return out.finish()
