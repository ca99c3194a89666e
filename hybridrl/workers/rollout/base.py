"""The rollout interface, the registry of engines by `rollout.name`, and the output layout they share.

Every engine turns B LEFT-padded prompts into a DataProto of B*n rows, each prompt's n samples adjacent (as
`DataProto.repeat(n, interleave=True)` orders them), every input non-tensor column repeated alike:

    prompts            (B*n, P)    the prompt ids, left-padded
    responses          (B*n, R)    generated ids, right-padded with the pad id
    input_ids          (B*n, P+R)  cat(prompts, responses)
    attention_mask     (B*n, P+R)  prompt mask, then response_mask
    position_ids       (B*n, P+R)  prompt positions, then last prompt position + 1, + 2, ...
    response_mask      (B*n, R)    1 up to and including the stop (EOS) token, 0 after it
    rollout_log_probs  (B*n, R)    the sampler's log-prob of each chosen token, 0 where masked
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from hybridrl.protocol import DataProto
from hybridrl.utils.registry import Registry
from hybridrl.utils.typed_config import to_dataclass
from hybridrl.workers.config import RolloutConfig


def rollout_logprob_diff_metrics(
    rollout_log_probs: torch.Tensor, old_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """Max and mean of |rollout_log_probs - old_log_probs| over the response tokens, all (batch, response_len);
    a gap beyond rounding means the rollout sampled from other weights (a weight-sync bug) or precision."""
    shapes = {t.shape for t in (rollout_log_probs, old_log_probs, response_mask)}
    if len(shapes) != 1:
        raise ValueError(
            "rollout_log_probs, old_log_probs and response_mask must share one (batch, response_len) "
            f"shape; got {tuple(rollout_log_probs.shape)}, {tuple(old_log_probs.shape)}, "
            f"{tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()
    if not bool(mask.any()):
        raise ValueError("response_mask has no 1s: there are no response tokens to compare")
    diff = (rollout_log_probs.float() - old_log_probs.float()).abs()[mask]  # (tokens,)
    return {
        "rollout/log_prob_diff_max": diff.max().item(),
        "rollout/log_prob_diff_mean": diff.mean().item(),
    }


PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")


class ServedActor(Protocol):
    """What a rollout engine asks of the training engine it generates with (hybridrl/workers/fsdp_engine.py)."""

    module: nn.Module

    def summon_full_params(self) -> contextlib.AbstractContextManager[Any]: ...

    def iter_full_weights(self) -> Iterator[tuple[str, torch.Tensor]]: ...

    def offload_params(self) -> None: ...

    def load_params(self) -> None: ...

    def offload_optimizer(self) -> None: ...

    def load_optimizer(self) -> None: ...


class BaseRollout(ABC):
    """A generation engine. Built through `build_rollout`, called by the actor_rollout worker."""

    config: RolloutConfig
    # True where the engine holds its own weights (vLLM): the actor's may leave the device while it generates
    holds_own_weights: bool = False

    @classmethod
    @abstractmethod
    def build(
        cls,
        config: RolloutConfig,
        *,
        module: nn.Module | None,
        tokenizer: Any,
        model_path: str | Path | None,
    ) -> BaseRollout:
        """Make the engine from what the worker holds; each engine takes the parts it needs."""

    @abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample responses for left-padded prompts; the output layout is in this module's docstring."""

    @abstractmethod
    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load the actor's current full (unsharded) weights into the engine."""

    @contextlib.contextmanager
    def serving(self, actor: ServedActor | None) -> Iterator[None]:
        """Generate with `actor`'s current weights for the block (`actor=None`: the engine's own weights), its
        optimizer state off the device (`fsdp_config.optimizer_offload`). A collective where the actor is sharded."""
        if actor is None:
            with self._awake():
                yield
            return
        actor.offload_optimizer()  # generation needs no optimizer state
        try:
            with self._serve_weights(actor):
                yield
        finally:
            actor.load_optimizer()

    def receive_weights(self, pairs: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Load weights sent from another pool (hybridrl/workers/weight_sync.py) into the engine, awake for it."""
        with self._awake():
            self.update_weights(pairs)

    @abstractmethod
    def _serve_weights(self, actor: ServedActor) -> contextlib.AbstractContextManager[None]:
        """The engine's part of `serving`: hand over the actor's weights, release what the block held."""

    @contextlib.contextmanager
    def _awake(self) -> Iterator[None]:
        """The engine's generation memory, taken back for the block and released after."""
        self.wake_up()
        try:
            yield
        finally:
            self.sleep()

    def sleep(self) -> None:
        """Release generation memory between rollout phases (engines without such memory: nothing)."""
        return None

    def wake_up(self) -> None:
        """Take memory back before the next rollout phase."""
        return None

    def close(self) -> None:
        """Release what the engine holds beyond memory (vLLM: its process groups); nothing by default."""
        return None


ROLLOUT_ENGINES: Registry[type[BaseRollout]] = Registry("rollout engine (actor_rollout_ref.rollout.name)")


def build_rollout(
    config: RolloutConfig | Mapping[str, Any],
    *,
    module: nn.Module | None = None,
    tokenizer: Any = None,
    model_path: str | Path | None = None,
) -> BaseRollout:
    """The engine named by `config.name`, e.g. `HFRollout` for "hf"."""
    config = to_dataclass(RolloutConfig, config)
    return ROLLOUT_ENGINES.get(config.name).build(
        config, module=module, tokenizer=tokenizer, model_path=model_path
    )


def eos_token_ids(*values: int | list[int] | None) -> list[int]:
    """EOS ids given as ints, lists or None (Qwen's generation config lists two) as one list, first occurrence first."""
    ids = [i for value in values if value is not None for i in ([value] if isinstance(value, int) else value)]
    return list(dict.fromkeys(int(i) for i in ids))


def check_prompts(prompts: DataProto) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, attention_mask, position_ids of a prompt batch, each (B, P), or a clear error."""
    if prompts.batch is None or any(key not in prompts.batch for key in PROMPT_KEYS):
        have = [] if prompts.batch is None else sorted(prompts.batch.keys())
        raise KeyError(f"generate_sequences needs batch keys {list(PROMPT_KEYS)}; got {have}")
    tensors = tuple(prompts.batch[key] for key in PROMPT_KEYS)
    shapes = {key: tuple(t.shape) for key, t in zip(PROMPT_KEYS, tensors, strict=True)}
    if len(set(shapes.values())) != 1 or tensors[0].dim() != 2:
        raise ValueError(f"prompt tensors must all be (batch, prompt_len); got shapes {shapes}")
    if bool((tensors[1][:, -1] == 0).any()):
        raise ValueError(
            "prompts must be LEFT-padded (every row's last attention_mask column is 1); "
            "use RLHFDataset's collate or tokenizer padding_side='left'"
        )
    return tensors  # type: ignore[return-value]


def assemble_output(
    prompts: DataProto,
    responses: torch.Tensor,
    response_lengths: torch.Tensor,
    log_probs: torch.Tensor,
    n: int,
) -> DataProto:
    """The rollout output from responses (B*n, R), pad ids at and after each row's length (B*n,), and log-probs."""
    input_ids, attention_mask, position_ids = (
        prompts.batch[key].repeat_interleave(n, dim=0) for key in PROMPT_KEYS
    )  # each (B*n, P)
    width = responses.shape[1]
    steps = torch.arange(width, device=responses.device)  # (R,)
    response_mask = (steps[None, :] < response_lengths[:, None]).to(attention_mask.dtype)  # (B*n, R)
    response_positions = position_ids[:, -1:] + 1 + steps[None, :]  # (B*n, R)
    batch = {
        "prompts": input_ids,
        "responses": responses,
        "input_ids": torch.cat([input_ids, responses], dim=1),  # (B*n, P+R)
        "attention_mask": torch.cat([attention_mask, response_mask], dim=1),
        "position_ids": torch.cat([position_ids, response_positions], dim=1),
        "response_mask": response_mask,
        "rollout_log_probs": torch.where(response_mask.bool(), log_probs.float(), 0.0),
    }
    non_tensors = {key: np.repeat(value, n) for key, value in prompts.non_tensor_batch.items()}
    return DataProto.from_dict(batch, non_tensors, meta_info=dict(prompts.meta_info))
