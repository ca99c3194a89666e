"""FSDP2 training engine: the only place models are sharded, stepped, offloaded and saved (actor, critic,
reference); each rank holds 1/N of every parameter, gradient and optimizer state (1/fsdp_size if set)."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from hybridrl.models.attention import default_attention
from hybridrl.models.loading import load_causal_lm, resolve_dtype
from hybridrl.models.lora import adapter_tensors, adapters_disabled, lora_scalings, merged_weights
from hybridrl.models.onednn_linear import use_onednn_linears
from hybridrl.utils.device import device_type as process_device_type
from hybridrl.utils.device import local_device
from hybridrl.workers.config import FSDPConfig, ModelConfig, OptimConfig, RewardModelModelConfig
from hybridrl.workers.sequence_parallel import SequenceParallel, model_problem


def load_model_for(model: ModelConfig | RewardModelModelConfig, gradient_checkpointing: bool, compute_dtype: str,
                   device_type: str, loader: Callable[..., torch.nn.Module] = load_causal_lm,
                   weights_dtype: str = "float32") -> torch.nn.Module:
    """The model at `model.path`, weights in `weights_dtype` (the master copy), with the attention suited to its
    compute dtype; `model.external_lib` is imported first (it registers custom architectures)."""
    if model.external_lib:
        importlib.import_module(model.external_lib)
    return loader(
        model.path, dtype=weights_dtype, trust_remote_code=model.trust_remote_code,
        override_config=model.override_config, gradient_checkpointing=gradient_checkpointing,
        attn_implementation=default_attention(resolve_dtype(compute_dtype), device_type),
    )


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks of a HF model (the units that FSDP shards one by one)."""
    no_split = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in no_split]
    if not layers:  # models that do not declare their block class: fall back to the usual attribute
        base = getattr(model, getattr(model, "base_model_prefix", "model"), model)
        layers = list(getattr(base, "layers", []))
    return layers


def build_device_mesh(world_size: int, fsdp_size: int = -1) -> DeviceMesh:
    """The ranks FSDP2 shards over: all (1-D, `fsdp`) when fsdp_size is negative or >= the world size, else
    hybrid sharding (2-D, `replicate` x `fsdp`) over groups of fsdp_size consecutive ranks."""
    if fsdp_size < 0 or fsdp_size >= world_size:
        return init_device_mesh(process_device_type(), (world_size,), mesh_dim_names=("fsdp",))
    if fsdp_size == 0 or world_size % fsdp_size:
        raise ValueError(f"fsdp_config.fsdp_size={fsdp_size} must divide the world size ({world_size}), or be -1 "
                         f"(shard over every rank)")
    return init_device_mesh(process_device_type(), (world_size // fsdp_size, fsdp_size),
                            mesh_dim_names=("replicate", "fsdp"))


def shard_model(model: nn.Module, mesh: DeviceMesh, config: FSDPConfig) -> nn.Module:
    """Apply FSDP2 to every decoder layer and then to the root; on a one-rank mesh, which shards nothing
    but would pay each layer unit's hooks in every pass, to the root only."""
    mp = MixedPrecisionPolicy(
        param_dtype=resolve_dtype(config.mixed_precision.param_dtype),
        reduce_dtype=resolve_dtype(config.mixed_precision.reduce_dtype),
    )
    if config.mixed_precision.buffer_dtype is not None:  # FSDP2's policy casts parameters only
        buffer_dtype = resolve_dtype(config.mixed_precision.buffer_dtype)
        for buffer in model.buffers():
            if buffer.is_floating_point():
                buffer.data = buffer.data.to(buffer_dtype)
    for layer in decoder_layers(model) if mesh.size() > 1 else []:
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=config.reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=config.reshard_after_forward)
    return model


def lr_lambda(step: int, warmup_steps: int, total_steps: int, style: str, min_lr_ratio: float,
              num_cycles: float) -> float:
    """Learning-rate multiplier at `step`: linear warmup, then constant or cosine decay to min_lr_ratio."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps  # step 0 trains with a small but non-zero rate
    if style == "constant":
        return 1.0
    if style == "cosine":
        decay_steps = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / decay_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * num_cycles * progress))
        return min_lr_ratio + (1.0 - min_lr_ratio) * cosine
    raise ValueError(f"optim.warmup_style must be 'constant' or 'cosine', got {style!r}")


def build_optimizer(model: nn.Module, config: OptimConfig) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over the trainable (sharded) parameters, fused on a CPU (far faster on DTensors), and its schedule."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = bool(params) and all(p.device.type == "cpu" and p.is_floating_point() for p in params)
    optimizer = torch.optim.AdamW(
        params, lr=config.lr, betas=tuple(config.betas), eps=config.eps,
        weight_decay=config.weight_decay, fused=fused or None,
    )
    total = config.total_training_steps
    if config.warmup_style == "cosine" and total <= 0:
        raise ValueError("optim.warmup_style=cosine needs optim.total_training_steps > 0 (the trainer sets it)")
    warmup = (config.lr_warmup_steps if config.lr_warmup_steps >= 0
              else int(config.lr_warmup_steps_ratio * max(total, 0)))
    schedule = lambda step: lr_lambda(step, warmup, total, config.warmup_style,  # noqa: E731
                                      config.min_lr_ratio, config.num_cycles)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def offload_refusals(config: FSDPConfig, key: str, device_type: str) -> list[str]:
    """One message per `param_offload` / `optimizer_offload` set where nothing would move the state (only the
    actor's rollout hand-off offloads); none on a CPU. `key` is the config section, e.g. `critic.model`."""
    if device_type == "cpu":
        return []
    return [f"{key}.fsdp_config.{name}=true is not supported on {device_type}: parameters and optimizer state "
            f"leave the device only in the actor's rollout hand-off (actor_rollout_ref.actor.fsdp_config.*). "
            f"Set it to false."
            for name in ("param_offload", "optimizer_offload") if getattr(config, name, False)]


def refuse_offload(refusals: list[str]) -> None:
    """Raise the first of `refusals` (for workers built without the trainer)."""
    if refusals:
        raise NotImplementedError(refusals[0])


class FSDPEngine:
    """A sharded model plus (optionally) its optimizer, scheduler and offload state. A LoRA model trains and
    checkpoints its adapters only; its full weights (for the rollout and HF exports) are the merged ones."""

    def __init__(self, model: nn.Module, fsdp_config: FSDPConfig, optim_config: OptimConfig | None = None,
                 grad_clip: float | None = 1.0, sequence_parallel_size: int = 1,
                 sequence_parallel_key: str = "ulysses_sequence_parallel_size") -> None:
        self.config = fsdp_config
        self.lora_scalings = lora_scalings(model)  # {LoRA layer: alpha/r}; empty without adapters
        self.device = local_device()  # the rank's device, from the LOCAL_RANK its launcher set
        self.mesh = build_device_mesh(dist.get_world_size(), fsdp_config.fsdp_size)
        # groups of ranks that split each sequence (hybridrl/workers/sequence_parallel.py); FSDP shards over all
        self.sequence_parallel = SequenceParallel.build(sequence_parallel_size, sequence_parallel_key)
        problem = model_problem(model, sequence_parallel_size) if sequence_parallel_size > 1 else None
        if problem:
            raise ValueError(f"{sequence_parallel_key}={sequence_parallel_size}: {type(model).__name__} cannot run "
                             f"with sequence parallelism: {problem}")
        if self.device.type == "cpu":
            use_onednn_linears(model)  # fp32 linears through oneDNN, not MKL (hybridrl/models/onednn_linear.py)
        self.module = shard_model(model.to(self.device), self.mesh, fsdp_config)
        # every fully_shard unit (the root, and with several ranks each decoder layer)
        self.fsdp_modules = [m for m in self.module.modules() if isinstance(m, FSDPModule)]
        self.grad_clip = grad_clip
        self.optim_config = optim_config
        self.optimizer, self.lr_scheduler = build_optimizer(self.module, optim_config) if optim_config else (None, None)
        self._params_offloaded = self._optimizer_offloaded = False

    @contextmanager
    def gradient_sync(self, enabled: bool) -> Iterator[None]:
        """Skip the gradient reduce-scatter on all but the last micro-batch of an accumulation (on a single
        rank the parameters also stay gathered from the first forward to the last backward)."""
        fsdp_modules = self.fsdp_modules if self.mesh.size() == 1 else []
        self.module.set_requires_gradient_sync(enabled)
        for m in fsdp_modules:
            m.set_reshard_after_forward(False, recurse=False)
            m.set_reshard_after_backward(enabled, recurse=False)  # the last micro-batch's backward reshards
        try:
            yield
        except BaseException:
            for m in fsdp_modules:  # a failed micro-batch leaves nothing gathered behind
                m.reshard()
            raise
        finally:
            self.module.set_requires_gradient_sync(True)
            for m in fsdp_modules:
                m.set_reshard_after_forward(self.config.reshard_after_forward, recurse=False)
                m.set_reshard_after_backward(True, recurse=False)

    def clip_and_step(self) -> dict[str, float]:
        """Clip by the global gradient norm, step if it is finite (a NaN/inf norm skips the update), zero grads."""
        if self.optimizer is None:
            raise RuntimeError("this engine was built without an optimizer (a reference or rollout model)")
        max_norm = self.grad_clip if self.grad_clip and self.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        grad_norm = float(grad_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": grad_norm, "lr": lr, "skipped_step": float(not math.isfinite(grad_norm))}

    def lr_scheduler_step(self) -> float:
        self.lr_scheduler.step()
        return self.lr_scheduler.get_last_lr()[0]

    @contextmanager
    def summon_full_params(self) -> Iterator[nn.Module]:
        """Gather every layer's full parameters once for the block, so generation's forwards need no collectives.
        They are a copy the block's end discards: an in-place change (a LoRA merge) never reaches the shards."""
        for m in self.fsdp_modules:
            m.set_reshard_after_forward(False, recurse=False)
            m.unshard()
        try:
            with torch.no_grad():
                yield self.module
        finally:
            for m in self.fsdp_modules:
                m.reshard()
                m.set_reshard_after_forward(self.config.reshard_after_forward, recurse=False)

    @property
    def has_lora(self) -> bool:
        return bool(self.lora_scalings)

    @contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        """The base model for the block (a LoRA actor's reference policy: no second copy of the weights)."""
        if not self.has_lora:
            raise RuntimeError("adapters_disabled needs a model with LoRA adapters (model.lora_rank > 0)")
        with adapters_disabled(self.module):
            yield

    def iter_full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) of the plain model's state dict (LoRA merged in), gathered one at a time (for an
        engine with its own weights, such as vLLM); a collective: every rank consumes it all, in order."""
        def gathered() -> Iterator[tuple[str, torch.Tensor]]:
            with torch.no_grad():
                for name, value in self.module.state_dict().items():
                    yield name, (value.full_tensor() if isinstance(value, DTensor) else value).detach()
        yield from merged_weights(gathered(), self.lora_scalings) if self.has_lora else gathered()

    def offload_params(self) -> None:
        if self.config.param_offload and self.device.type != "cpu" and not self._params_offloaded:
            self.module.to("cpu")
            self._params_offloaded = True

    def load_params(self) -> None:
        if self._params_offloaded:
            self.module.to(self.device)
            self._params_offloaded = False

    def offload_optimizer(self) -> None:
        if self.config.optimizer_offload and self.optimizer is not None and not self._optimizer_offloaded:
            self._move_optimizer_state("cpu")
            self._optimizer_offloaded = self.device.type != "cpu"

    def load_optimizer(self) -> None:
        if self._optimizer_offloaded:
            self._move_optimizer_state(self.device)
            self._optimizer_offloaded = False

    def _move_optimizer_state(self, device: str | torch.device) -> None:
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    state[key] = value.to(device, non_blocking=True)

    def full_model_state_dict(self) -> dict[str, torch.Tensor]:
        """The plain model's unsharded parameters (LoRA merged in) on CPU, on rank 0 only; a collective."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.module, options=options)
        return dict(merged_weights(state.items(), self.lora_scalings)) if self.has_lora and state else state

    def full_adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The LoRA matrices, unsharded on CPU, on rank 0 only (others get {}); a collective."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        return adapter_tensors(get_model_state_dict(self.module, options=options).items())

    def _model_state_options(self) -> StateDictOptions:
        """A LoRA model's checkpointed state is its adapters: the frozen base comes from model.path."""
        return StateDictOptions(ignore_frozen_params=self.has_lora, strict=not self.has_lora)

    def sharded_state(self) -> dict[str, Any]:
        """This rank's shards of model (a LoRA model: adapters) and optimizer state, plus the scheduler."""
        model_state = get_model_state_dict(self.module, options=self._model_state_options())
        if self.has_lora:  # a frozen weight tied to another (lm_head) survives ignore_frozen_params
            model_state = adapter_tensors(model_state.items())
        state = {"model": model_state}
        if self.optimizer is not None:
            state["optimizer"] = get_optimizer_state_dict(self.module, self.optimizer)
            state["lr_scheduler"] = self.lr_scheduler.state_dict()
        return state

    def load_sharded_state(self, state: dict[str, Any]) -> None:
        """Restore model and optimizer shards (moments, step count) and the schedule's position; lr, betas, eps
        and weight decay stay this run's config, so a resumed run trains at a new `optim.lr`."""
        set_model_state_dict(self.module, state["model"], options=self._model_state_options())
        if self.optimizer is not None and "optimizer" in state:
            set_optimizer_state_dict(self.module, self.optimizer, state["optimizer"])
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
            self._apply_optim_config()

    def _apply_optim_config(self) -> None:
        cfg = self.optim_config
        position = self.lr_scheduler.last_epoch
        for group, factor in zip(self.optimizer.param_groups, self.lr_scheduler.lr_lambdas, strict=True):
            group.update(betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay, initial_lr=cfg.lr,
                         lr=cfg.lr * factor(position))  # the lr this schedule gives at the restored step
        self.lr_scheduler.base_lrs = [cfg.lr] * len(self.optimizer.param_groups)
        self.lr_scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]  # get_last_lr()
