"""One pass of a model over rollout rows, read at the response positions (log-probs, values); with prompt
sharing, rows with equal prompts compute them once per forward (`hybridrl.models.attention`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F

from hybridrl.models.attention import (
    head_on_kept_positions,
    prompt_groups,
    shared_prompt_forward,
    shared_prompt_mode,
    supports_shared_prompt,
)
from hybridrl.protocol import DataProto
from hybridrl.workers.fsdp_engine import FSDPEngine
from hybridrl.workers.micro_batch import make_micro_batches, restore_order, trim_columns
from hybridrl.workers.sequence_parallel import SequenceParallel, ulysses_mode
from hybridrl.workers.update_loop import BatchingPlan, MicroStep, run_updates

# (outputs at some response positions (rows, n, vocab or labels), those positions (n,)) -> {name: (rows, n)}
PerTokenFn = Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]

logger = logging.getLogger(__name__)


def response_logits(module: torch.nn.Module, micro: DataProto, share_prompts: bool, always_packed: bool,
                    share_key: str) -> torch.Tensor:
    """Logits predicting each response token (or a critic's outputs there), (rows, kept_response_len, vocab).
    `share_prompts`: rows with equal prompts compute their prompt once (`always_packed`: even where all
    differ, as in `shared_prompt_mode`); `share_key` is the config key errors name."""
    response_length = micro.batch["responses"].shape[-1]
    trimmed = trim_columns(micro, response_length)
    start = trimmed.response_start
    packable = trimmed.response_kept > 0 and trimmed.position_ids.dim() == 2
    if always_packed and not packable:
        raise RuntimeError(
            "a micro-batch without response tokens (or with multi-dimensional position ids) cannot run as a "
            f"shared-prompt pass under gradient checkpointing; set {share_key}=false"
        )
    if share_prompts and packable:
        prompt_of_row, first_rows = prompt_groups(trimmed.input_ids[:, :start], trimmed.attention_mask[:, :start])
        if always_packed or len(first_rows) < len(prompt_of_row):  # some prompt is there more than once
            return shared_prompt_forward(module, trimmed.input_ids, trimmed.attention_mask, trimmed.position_ids,
                                         start, trimmed.response_kept, prompt_of_row, first_rows)
    head_kwargs, at_kept = head_on_kept_positions(module, trimmed.response_kept + 1)
    output = module(input_ids=trimmed.input_ids, attention_mask=trimmed.attention_mask,
                    position_ids=trimmed.position_ids, use_cache=False, **head_kwargs)
    # logits at column c predict token c + 1: the last kept+1 columns start one before the response
    return at_kept(output.logits)[:, : trimmed.response_kept]


def prompt_group_ids(data: DataProto) -> torch.Tensor:
    """(rows,) ids equal for rows whose prompt columns are equal (the GRPO/RLOO group of n responses)."""
    prompt_len = data.batch["input_ids"].shape[-1] - data.batch["responses"].shape[-1]
    return prompt_groups(data.batch["input_ids"][:, :prompt_len], data.batch["attention_mask"][:, :prompt_len])[0]


def activation_checkpointing_on(module: torch.nn.Module) -> bool:
    """Whether a transformers model recomputes its layers in backward (transformers 5 renamed the property)."""
    name = "is_activation_checkpointing" if hasattr(type(module), "is_activation_checkpointing") \
        else "is_gradient_checkpointing"
    return bool(getattr(module, name, False))


class PromptSharing:
    """Whether a worker's passes over `module` share prompts: asked by config key `share_key`, possible for
    the model (`supports_shared_prompt`) and without sequence parallelism; else padded passes, with a warning."""

    def __init__(self, module: torch.nn.Module, asked: bool, share_key: str,
                 sequence_parallel: SequenceParallel | None = None) -> None:
        self.sequence_parallel = sequence_parallel or SequenceParallel()
        able = supports_shared_prompt(module)
        if asked and self.sequence_parallel.enabled:
            logger.warning("%s=true has no effect with sequence parallelism (ulysses_sequence_parallel_size=%d): "
                           "each sequence is split across ranks, so no prompt is computed once for several rows",
                           share_key, self.sequence_parallel.size)
            asked = False
        elif asked and not able:
            logger.warning(
                "%s=true, but %s (attention %r) cannot share prompts in one forward (full attention with sdpa, "
                "eager or grouped_eager only): every row computes its prompt", share_key, type(module).__name__,
                getattr(getattr(module, "config", None), "_attn_implementation", None))
        self.module, self.share_key = module, share_key
        self.enabled = asked and able
        self.hold_packed = self.enabled and activation_checkpointing_on(module)

    def group_ids(self, data: DataProto) -> torch.Tensor | None:
        """The rows `make_micro_batches` keeps together (None: no grouping)."""
        return prompt_group_ids(data) if self.enabled else None

    def per_token(self, micro: DataProto, compute: PerTokenFn) -> dict[str, torch.Tensor]:
        """`compute` over the model's outputs predicting the micro-batch's kept response tokens: {name: (rows,
        response_len)}, zero after each response's end; with sequence parallelism each rank computes its
        columns' part, then they are joined."""
        sp = self.sequence_parallel
        if not sp.enabled:
            outputs = response_logits(self.module, micro, self.enabled, self.hold_packed, self.share_key)
            kept = compute(outputs, torch.arange(outputs.shape[1], device=outputs.device))  # each (rows, kept)
        else:
            trimmed = trim_columns(micro, micro.batch["responses"].shape[-1])
            first = trimmed.response_start - 1  # the column predicting the first response token
            outputs, places, counts = sp.forward(self.module, trimmed.input_ids, trimmed.attention_mask,
                                                 trimmed.position_ids, first, trimmed.response_kept)
            kept = {name: sp.gather_columns(value, counts) for name, value in compute(outputs, places).items()}
        mask = micro.batch["response_mask"]  # (rows, response_len)
        return {name: F.pad(value, (0, mask.shape[-1] - value.shape[1])) * mask.to(value.dtype)
                for name, value in kept.items()}

    def held(self) -> contextlib.AbstractContextManager[None]:
        """Around an update: `shared_prompt_mode` where layers are checkpointed, `ulysses_mode` with sequence
        parallelism."""
        if self.sequence_parallel.enabled:
            return ulysses_mode(self.module)
        return shared_prompt_mode(self.module) if self.hold_packed else contextlib.nullcontext()


class PromptSharingRole:
    """The actor's and critic's config, engine and `PromptSharing` (asked for by the config key `SHARE_KEY`), and
    the batching of their passes over the rank's rows."""

    SHARE_KEY: str

    def __init__(self, config: Any, engine: FSDPEngine, share_prompts: bool = False) -> None:
        self.config = config
        self.engine = engine
        self.prompt_sharing = PromptSharing(engine.module, share_prompts, self.SHARE_KEY, engine.sequence_parallel)

    @property
    def share_prompts(self) -> bool:
        return self.prompt_sharing.enabled

    def group_rows(self, data: DataProto, plan: BatchingPlan) -> tuple[DataProto, BatchingPlan]:
        """The rows and batching of the rank's data-parallel group: with sequence parallelism its ranks' rows
        together, mini-batches and the token budget per pass `size` times larger."""
        sp = self.engine.sequence_parallel
        if not sp.enabled:
            return data, plan
        tokens = None if plan.max_token_len is None else plan.max_token_len * sp.size
        return sp.gather_rows(data, plan.mini_batch_rows), replace(plan, mini_batch_rows=plan.mini_batch_rows * sp.size,
                                                                   max_token_len=tokens)

    @torch.no_grad()
    def forward_rows(self, data: DataProto, micro_batch_rows: int | None, max_token_len: int | None,
                     per_token: Callable[[DataProto], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """`per_token(micro_batch)` over the rank's rows in eval mode, joined: {name: (rows, ...)} in row order."""
        self.engine.module.eval()
        data, plan = self.group_rows(data, BatchingPlan(len(data), micro_batch_rows, max_token_len))
        micro_batches = make_micro_batches(data, plan.micro_batch_rows, plan.max_token_len,
                                           self.prompt_sharing.group_ids(data))
        parts: dict[str, list[torch.Tensor]] = {}
        for mb in micro_batches:
            for name, value in per_token(mb.data).items():
                parts.setdefault(name, []).append(value)
        own = self.engine.sequence_parallel.own_rows
        return {name: own(restore_order(values, micro_batches, len(data))) for name, values in parts.items()}

    def run_updates(self, data: DataProto, plan: BatchingPlan, micro_step: MicroStep,
                    prefix: str) -> dict[str, list[float]]:
        """`update_loop.run_updates` over rows and a plan from `group_rows`, in train mode."""
        self.engine.module.train()
        with self.prompt_sharing.held():
            return run_updates(self.engine, data, plan, micro_step, prefix, self.prompt_sharing.group_ids)
