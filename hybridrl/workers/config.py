"""Typed settings of the workers, under verl's key names (`actor_rollout_ref.*`, `critic.*`).

These dataclasses are the one home of the workers' defaults. The Hydra config composes them; every
worker receives either a dataclass or an OmegaConf node of the same shape (`to_dataclass` converts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from omegaconf import OmegaConf

T = TypeVar("T")


@dataclass
class OptimConfig:
    # Peak learning rate of AdamW.
    lr: float = 1e-6
    # Warmup steps; -1 derives them from lr_warmup_steps_ratio x total_training_steps.
    lr_warmup_steps: int = -1
    lr_warmup_steps_ratio: float = 0.0
    # After warmup: "constant" or "cosine" (decays to min_lr_ratio x lr over the remaining steps).
    warmup_style: str = "constant"
    min_lr_ratio: float = 0.0
    # Cosine cycles over the decay phase; 0.5 is one half-cosine from lr down to the floor.
    num_cycles: float = 0.5
    # Filled in by the trainer from the data size and epochs; the cosine schedule needs it.
    total_training_steps: int = -1
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8


@dataclass
class MixedPrecisionConfig:
    # dtype of parameters during forward/backward; "float32" on CPU, "bfloat16" on GPUs.
    param_dtype: str = "float32"
    # dtype of the gradient reduce-scatter across ranks.
    reduce_dtype: str = "float32"


@dataclass
class FSDPConfig:
    # Move parameters / optimizer state to CPU memory between phases (no-op when already on CPU).
    param_offload: bool = False
    optimizer_offload: bool = False
    # Free gathered parameters after each layer's forward (saves memory, costs an all-gather in backward).
    reshard_after_forward: bool = True
    # Ranks that shard one model; -1 means all ranks of the group.
    fsdp_size: int = -1
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


def to_dataclass(cls: type[T], value: Any) -> T:
    """A `cls` instance from an instance, a dict or an OmegaConf node, type-checked by OmegaConf.

    Unknown keys and values of the wrong type raise with the key's full path in the message.
    """
    if isinstance(value, cls):
        return value
    merged = OmegaConf.merge(OmegaConf.structured(cls), value if value is not None else {})
    return OmegaConf.to_object(merged)
