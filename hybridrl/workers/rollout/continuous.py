"""Continuous batching for the HF engine's streaming mode (docs/placement.md, "Streaming"): a finished row's
place goes to a waiting prompt's sample at once. Every row writes its next key/value at one shared column of
`SharedColumnCache`, a row admitted later holding its prompt just left of it, so rows of different lengths
decode in one batched step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache

from hybridrl.data.rl_dataset import left_pad
from hybridrl.protocol import DataProto
from hybridrl.workers.micro_batch import trim_columns
from hybridrl.workers.rollout.base import assemble_output
from hybridrl.workers.rollout.fused_decoder import FusedDecoder
from hybridrl.workers.rollout.kv_cache import BufferLayer, ForwardSteps, PreallocatedCache, forward_logits
from hybridrl.workers.rollout.sampling import SamplingParams, sample_tokens


class SharedColumnLayer(BufferLayer):
    """One layer's keys and values in zeroed (rows, H, width, D) buffers; a step writes every row at the owner's
    column, and attention reads from the owner's `start` (the first column any decoding row uses) to it."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("SharedColumnCache layers are filled by SharedColumnCache.append, not by a forward")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        start, column = self.owner.start, self.owner.column
        end = column + key_states.shape[-2]
        self.keys[:, :, column: end] = key_states
        self.values[:, :, column: end] = value_states
        return self.keys[:, :, start: end], self.values[:, :, start: end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.column + query_length - self.owner.start, 0

    def get_seq_length(self) -> int:
        return self.owner.column - self.owner.start

    def get_max_length(self) -> int:
        return self.owner.width


class SharedColumnCache(Cache):
    """`num_layers` `SharedColumnLayer`s `width` columns wide, written next at `column`, read from `start`."""

    def __init__(self, num_layers: int, width: int) -> None:
        self.width = width
        self.column = 0
        self.start = 0
        super().__init__(layers=[SharedColumnLayer(self) for _ in range(num_layers)])

    def append(self, prefilled: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Add rows whose keys/values per layer are (new, H, L, D), written in columns [column - L, column)."""
        length = prefilled[0][0].shape[-2]
        if length > self.column:
            raise ValueError(f"{length} prefilled columns do not fit left of column {self.column}")
        pad = (0, 0, self.column - length, self.width - self.column)  # zeros around [column - L, column)
        for layer, (keys, values) in zip(self.layers, prefilled, strict=True):
            keys, values = F.pad(keys, pad), F.pad(values, pad)
            if layer.keys is not None:
                keys, values = torch.cat([layer.keys, keys]), torch.cat([layer.values, values])
            layer.keys, layer.values = keys, values
            layer.is_initialized = True

    def keep(self, rows: torch.Tensor) -> None:
        for layer in self.layers:
            if layer.keys is not None:
                layer.keys, layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)

    def shift(self, by: int) -> None:
        """Move every row's columns `by` to the right (left if negative), zeros coming in, and the column too."""
        for layer in self.layers:
            if layer.keys is not None:
                layer.keys, layer.values = _shifted(layer.keys, by), _shifted(layer.values, by)
        self.column += by


def _shifted(buffer: torch.Tensor, by: int) -> torch.Tensor:
    """Columns (dim -2 of a 4-D buffer, dim -1 of a 2-D one) moved `by` places, zeros filling the gap."""
    return F.pad(buffer, (0, 0, by, -by) if buffer.dim() == 4 else (by, -by))  # a negative pad crops


@dataclass
class Request:
    """One prompt (its left-padded row) for `n` samples, and its finished samples by sample index."""

    prompt: DataProto
    n: int
    samples: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]] = field(default_factory=dict)


ROW_STATE = ("active", "request_of", "sample_of", "length", "position", "mask", "responses", "log_probs", "versions",
             "pending")


class ContinuousBatch:
    """Rows (slots, one per sample) decoding across calls, at most `capacity` (rollout.max_num_seqs), and prompts
    waiting for room; idle slots leave once they are `IDLE_SHARE` of the batch and nothing waits."""

    IDLE_SHARE = 0.125

    def __init__(self, params: SamplingParams, pad_token_id: int, prompt_len: int, capacity: int,
                 generator: torch.Generator, device: torch.device | str = "cpu") -> None:
        self.params, self.pad_token_id, self.generator = params, pad_token_id, generator
        self.device = torch.device(device)
        self.capacity = max(capacity, params.n)
        self.response_len = params.response_length
        self.span = prompt_len + self.response_len  # the most columns one row uses
        self.stop_ids = torch.tensor(params.stop_token_ids, dtype=torch.long, device=self.device)
        self.waiting: list[int] = []  # request ids not yet admitted, in order
        self.requests: dict[int, Request] = {}
        self._next_id = 0
        self.cache: SharedColumnCache | None = None
        self.kv_version: int | None = None  # the weights the cache's keys/values came from

        def empty(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(0, *shape, dtype=dtype, device=self.device)

        self.active = empty(dtype=torch.bool)  # (A,) the slot holds a sample still decoding
        self.request_of = empty()  # (A,) request id of each row
        self.sample_of = empty()  # (A,) its sample index in the request
        self.length = empty()  # (A,) tokens sampled so far
        self.position = empty()  # (A,) position of the next token fed
        self.mask = empty(0)  # (A, cache width) 0/1: the columns each row attends to
        self.responses = empty(self.response_len)  # (A, R)
        self.log_probs = empty(self.response_len, dtype=torch.float32)  # (A, R)
        self.versions = empty(self.response_len)  # (A, R) the weight version of each token
        self.pending = empty()  # (A,) each row's last sampled token, not yet fed

    @property
    def rows(self) -> int:
        """Slots in the batch, idle ones included."""
        return int(self.active.numel())

    @property
    def decoding(self) -> int:
        """Rows whose sample is still decoding."""
        return int(self.active.sum())

    @property
    def in_flight(self) -> int:
        """Prompts admitted or waiting, not yet finished."""
        return len(self.requests)

    def add(self, prompts: DataProto) -> None:
        """Queue prompts (each a row of a left-padded prompt batch) for `n` samples each."""
        for i in range(len(prompts)):
            self.requests[self._next_id] = Request(prompts.select_rows([i]), self.params.n)
            self.waiting.append(self._next_id)
            self._next_id += 1

    def unfinished_prompts(self) -> DataProto | None:
        """The prompts in flight or waiting, in admission order (what a checkpoint regenerates)."""
        prompts = [self.requests[r].prompt for r in sorted(self.requests)]
        return DataProto.concat(prompts) if prompts else None

    def run(self, model: nn.Module, decoder: FusedDecoder | None, version: int, max_steps: int,
            min_groups: int = 1, partial: bool = True) -> DataProto | None:
        """Decode until `min_groups` prompts have all their samples, nothing is left, or `max_steps` tokens were
        sampled -> the finished groups (rollout layout, plus `rollout_versions` (rows, R): each token's weight
        version, -1 past the response, and `weight_version` (rows,): the oldest), or None. New weights re-prefill
        the rows in flight; `partial=False` refuses them instead."""
        finished: list[DataProto] = []
        logits = None
        if self.decoding and self.kv_version != version and not partial:
            raise RuntimeError(f"weights changed to version {version} with {self.decoding} rows in flight under "
                               f"version {self.kv_version}; without partial rollout they finish before a weight sync")
        if self.decoding:
            logits = self._reprefill(model) if self.kv_version != version else self._step(model, decoder)
        self.kv_version = version
        logits = self._admit(model, logits)
        sampled = 0
        while self.decoding:
            tokens, token_log_probs = sample_tokens(logits, self.params, self.generator)  # (A,), (A,)
            rows = self.active.nonzero().squeeze(1)
            at = self.length[rows]
            self.responses[rows, at] = tokens[rows]
            self.log_probs[rows, at] = token_log_probs[rows].float()
            self.versions[rows, at] = version
            self.length[rows] = at + 1
            self.pending = tokens
            done = self.active & (torch.isin(tokens, self.stop_ids) | (self.length >= self.response_len))
            if bool(done.any()):
                finished += self._finish(done)
            sampled += 1
            if len(finished) >= min_groups or sampled >= max_steps:
                break
            logits = self._step(model, decoder) if self.decoding else None
            logits = self._admit(model, logits)
        return DataProto.concat(finished) if finished else None

    def _step(self, model: nn.Module, decoder: FusedDecoder | None) -> torch.Tensor:
        """Feed every row its last sampled token -> next-token logits (A, V) (idle slots' are not used)."""
        cache = self.cache
        if cache.column >= cache.width:
            self._compact()
        self.mask[:, cache.column] = 1
        cache.start = self._first_used_column()
        seen = self.mask[:, cache.start: cache.column + 1]
        logits = ForwardSteps(model, cache, decoder).step(self.pending, self.position, seen)
        self.position = self.position + 1
        cache.column += 1
        return logits

    def _first_used_column(self) -> int:
        used = self.mask[self.active].bool().any(dim=0).nonzero()
        return int(used[0]) if used.numel() else self.cache.column

    def _compact(self) -> None:
        """Move every row left by the columns no decoding row uses (at least width - span: a row spans <= span)."""
        self._shift(-self._first_used_column())

    def _shift(self, by: int) -> None:
        self.cache.shift(by)
        self.mask = _shifted(self.mask, by)

    def _admit(self, model: nn.Module, logits: torch.Tensor | None) -> torch.Tensor | None:
        """Prefill waiting prompts while their samples fit (idle slots first, then new rows) into `logits`."""
        count = max(0, (self.capacity - self.decoding) // self.params.n)
        admitted, self.waiting = self.waiting[:count], self.waiting[count:]
        if not admitted:
            return logits
        prompts = trim_columns(DataProto.concat([self.requests[r].prompt for r in admitted]), response_length=0)
        mask, positions = prompts.attention_mask, prompts.position_ids
        n = self.params.n
        new_logits, kv = self._prefill(model, prompts.input_ids, mask, positions)
        kv = [(k.repeat_interleave(n, 0), v.repeat_interleave(n, 0)) for k, v in kv]
        slots = self._place(kv, mask.repeat_interleave(n, 0), positions[:, -1].repeat_interleave(n) + 1)
        self.request_of[slots] = torch.tensor(admitted, device=self.device).repeat_interleave(n)
        self.sample_of[slots] = torch.arange(n, device=self.device).repeat(len(admitted))
        self.length[slots] = 0
        self.responses[slots] = self.pad_token_id
        self.log_probs[slots] = 0.0
        self.versions[slots] = 0
        self.active[slots] = True
        new_logits = new_logits.repeat_interleave(n, 0)
        logits = new_logits[:0] if logits is None else logits
        if logits.shape[0] < self.rows:  # rows were added: a row of logits per slot
            logits = F.pad(logits, (0, 0, 0, self.rows - logits.shape[0]))
        logits[slots] = new_logits
        return logits

    def _place(self, kv: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor,
               next_position: torch.Tensor) -> torch.Tensor:
        """Write new rows' prefilled columns `mask` (new, L) into idle slots, then appended rows -> the slots."""
        new, length = mask.shape
        if self.cache is None:
            self._new_cache(len(kv), self.span, rows=0)
        cache = self.cache
        if cache.column < length:  # the new rows' columns end at the shared column: make room left of it
            self._shift(length - cache.column)
        idle = (~self.active).nonzero().squeeze(1)[:new]
        reused, appended = idle.numel(), new - idle.numel()
        columns = slice(cache.column - length, cache.column)
        if reused:
            for layer, (keys, values) in zip(cache.layers, kv, strict=True):
                layer.keys[idle, :, columns] = keys[:reused]
                layer.values[idle, :, columns] = values[:reused]
        if appended:
            cache.append([(k[reused:], v[reused:]) for k, v in kv])
            for name in ROW_STATE:  # zeros for the appended slots
                state = getattr(self, name)
                setattr(self, name, torch.cat([state, state.new_zeros(appended, *state.shape[1:])]))
        slots = torch.cat([idle, torch.arange(self.rows - appended, self.rows, device=self.device)])
        self.mask[slots] = 0
        self.mask[slots, columns] = mask
        self.position[slots] = next_position
        return slots

    def _new_cache(self, num_layers: int, column: int, rows: int) -> None:
        """An empty cache twice a row's span wide (a move left frees at least a span), writing next at `column`."""
        self.cache = SharedColumnCache(num_layers, 2 * self.span + 1)
        self.cache.column = column
        self.mask = torch.zeros(rows, self.cache.width, dtype=torch.long, device=self.device)

    def _prefill(self, model: nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                 positions: torch.Tensor) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Left-padded rows (B, L) through the model -> next-token logits (B, V) and each layer's (B, H, L, D)."""
        cache = PreallocatedCache(model.config.num_hidden_layers, ids.shape[1])
        logits = forward_logits(model, ids, mask, positions, cache)
        return logits, [(layer.keys, layer.values) for layer in cache.layers]  # exactly L wide

    def _keep(self, rows: torch.Tensor) -> None:
        """Only slots `rows` stay in the batch."""
        self.cache.keep(rows)
        for name in ROW_STATE:
            setattr(self, name, getattr(self, name)[rows])

    def _reprefill(self, model: nn.Module) -> torch.Tensor:
        """Rebuild the decoding rows' keys/values under the current weights (idle slots dropped) -> logits (A, V)."""
        self._keep(self.active.nonzero().squeeze(1))
        sequences, starts = [], []
        for row in range(self.rows):
            prompt = self.requests[int(self.request_of[row])].prompt.batch
            real = prompt["attention_mask"][0].bool()
            tokens = torch.cat([prompt["input_ids"][0][real], self.responses[row, : int(self.length[row])]])
            sequences.append(tokens.tolist())
            starts.append(int(prompt["position_ids"][0][real][0]))
        longest = max(len(tokens) for tokens in sequences)
        padded = [left_pad(tokens, longest, self.pad_token_id) for tokens in sequences]  # as the dataset pads
        ids, mask, pos = (torch.stack(column).to(self.device) for column in zip(*padded, strict=True))
        pos = pos + torch.tensor(starts, device=self.device)[:, None] * mask  # each row's own first position
        logits, kv = self._prefill(model, ids, mask, pos)
        self._new_cache(len(kv), max(self.span, longest), rows=self.rows)
        self.cache.append(kv)
        self.mask[:, self.cache.column - longest: self.cache.column] = mask
        self.position = pos[:, -1] + 1
        return logits

    def _finish(self, done: torch.Tensor) -> list[DataProto]:
        """Rows `done` stop decoding (their slots go idle) -> the requests whose samples have all finished."""
        groups = []
        for row in done.nonzero().squeeze(1).tolist():
            request_id = int(self.request_of[row])
            request = self.requests[request_id]
            request.samples[int(self.sample_of[row])] = (
                self.responses[row].clone(), self.log_probs[row].clone(), self.versions[row].clone(),
                int(self.length[row]))
            if len(request.samples) == request.n:
                groups.append(self._group(self.requests.pop(request_id)))
        self.active &= ~done
        if not self.waiting and self.rows - self.decoding >= self.IDLE_SHARE * self.rows:
            self._keep(self.active.nonzero().squeeze(1))
        return groups

    def _group(self, request: Request) -> DataProto:
        samples = [request.samples[i] for i in range(request.n)]
        responses, log_probs, versions = (torch.stack([s[k] for s in samples]) for k in range(3))
        lengths = torch.tensor([s[3] for s in samples], device=self.device)
        after = torch.arange(self.response_len, device=self.device)[None, :] >= lengths[:, None]  # (n, R)
        out = assemble_output(request.prompt, responses.masked_fill(after, self.pad_token_id), lengths, log_probs,
                              request.n)
        out.batch["rollout_versions"] = versions.masked_fill(after, -1)
        out.batch["weight_version"] = versions.masked_fill(after, np.iinfo(np.int64).max).min(dim=1).values
        return out
