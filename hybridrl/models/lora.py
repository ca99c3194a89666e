"""LoRA adapters (docs/lora.md) on a Hugging Face causal LM: PEFT's LoRA layers injected in place, so the
model keeps its class. A targeted linear `p` computes W x + (alpha / r) B (A x) (W frozen, B = 0 at start)
and holds `p.base_layer.weight`, `p.lora_A.default.weight` (r, in) and `p.lora_B.default.weight` (out, r).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from hybridrl.workers.config import ModelConfig

ADAPTER = "default"  # PEFT's name for the one adapter a model holds here
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_SUBDIR = "lora_adapter"  # where checkpoints and the merger put the PEFT adapter directory
INIT_SEED = 0  # of lora_A's random initialisation (lora_B starts at zero)
_PEFT_PREFIX = "base_model.model."  # PEFT's adapter files name tensors under its wrapper's prefix


class LoRAError(ValueError):
    """A LoRA setting or adapter directory that cannot be used, with the key or file to fix."""


def _names(value: Any, kind: type = tuple) -> Any:
    """A module-name setting: a string (or None) as is, else a `kind` of strings."""
    return value if value is None or isinstance(value, str) else kind(str(t) for t in value)


@dataclass(frozen=True)
class LoRASettings:
    """The adapter to add: verl's `model.lora_rank`, `lora_alpha`, `target_modules`, `exclude_modules`,
    `lora_adapter_path` (an adapter directory to start from; its own rank, alpha and targets then win)."""

    rank: int = 0
    alpha: float = 16
    target_modules: str | tuple[str, ...] = "all-linear"
    exclude_modules: str | tuple[str, ...] | None = None
    adapter_path: str | None = None
    key: str = "actor_rollout_ref.model"  # the config section, for error messages

    @property
    def enabled(self) -> bool:
        return self.rank > 0 or bool(self.adapter_path)

    @classmethod
    def from_model_config(cls, model: ModelConfig, key: str = "actor_rollout_ref.model") -> LoRASettings:
        """The settings of a `ModelConfig` (hybridrl/workers/config.py), checked."""
        settings = cls(int(model.lora_rank), float(model.lora_alpha), _names(model.target_modules),
                       _names(model.exclude_modules), model.lora_adapter_path or None, key)
        settings.check()
        return settings

    @classmethod
    def from_sft_model(cls, model: Any) -> LoRASettings:
        """The settings of the SFT config's `model` section (verl's SFT keys: rank, alpha, targets), checked."""
        settings = cls(int(model.lora_rank), float(model.lora_alpha), _names(model.target_modules), key="model")
        settings.check()
        return settings

    def check(self) -> None:
        if self.rank < 0:
            raise LoRAError(f"{self.key}.lora_rank={self.rank} must be >= 0 (0 turns LoRA off)")
        if self.rank > 0 and self.alpha <= 0:
            raise LoRAError(f"{self.key}.lora_alpha={self.alpha} must be > 0 (the adapter's scale is alpha/rank)")
        if not self.target_modules:
            raise LoRAError(f"{self.key}.target_modules is empty: name the linears to adapt, or 'all-linear'")
        if self.adapter_path:
            directory = Path(self.adapter_path)
            missing = [n for n in (ADAPTER_CONFIG, ADAPTER_WEIGHTS) if not (directory / n).is_file()]
            if missing:
                raise LoRAError(f"{self.key}.lora_adapter_path={self.adapter_path} lacks {missing}: it must be a "
                                f"PEFT adapter directory (a checkpoint's actor/{ADAPTER_SUBDIR}/ is one)")

    def peft_config(self) -> Any:
        """PEFT's LoraConfig: from the adapter directory when one is given, else from these settings."""
        from peft import LoraConfig

        if self.adapter_path:
            config = LoraConfig.from_pretrained(self.adapter_path)
            config.inference_mode = False
            return config
        return LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=0.0, bias="none",
                          task_type="CAUSAL_LM", target_modules=_names(self.target_modules, list),
                          exclude_modules=_names(self.exclude_modules, list))


def add_lora(model: nn.Module, settings: LoRASettings, base_dtype: torch.dtype | None = None) -> nn.Module:
    """Inject LoRA layers into `model` in place (from `settings.adapter_path`'s weights when set), return it:
    adapters trainable in fp32, every other parameter frozen (in `base_dtype`, the compute dtype, if set)."""
    from peft import inject_adapter_in_model

    config = settings.peft_config()
    # every rank and every run draws the same lora_A, without moving the process's random stream
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(INIT_SEED)
        try:
            inject_adapter_in_model(config, model, adapter_name=ADAPTER)
        except ValueError as err:  # PEFT's "Target modules ... not found in the base model"
            shown = _names(settings.target_modules, list)
            raise LoRAError(f"{settings.key}.target_modules={shown!r}: {err}") from err
    for name, param in model.named_parameters():
        is_adapter = _is_adapter_name(name)
        param.requires_grad_(is_adapter)
        if is_adapter and param.dtype != torch.float32:
            param.data = param.data.float()
        elif not is_adapter and base_dtype is not None and param.is_floating_point() and param.dtype != base_dtype:
            param.data = param.data.to(base_dtype)
    if settings.adapter_path:
        load_adapter_weights(model, settings.adapter_path)
    return model


def _is_adapter_name(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def lora_layers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """(qualified name, layer) of every LoRA layer in `module`."""
    if "peft" not in sys.modules:  # nothing injected adapters, and importing PEFT costs seconds per process
        return []
    from peft.tuners.lora import LoraLayer

    return [(name, m) for name, m in module.named_modules() if isinstance(m, LoraLayer)]


def lora_scalings(module: nn.Module) -> dict[str, float]:
    """{qualified name of a LoRA layer: its scale alpha/r}, for `merged_weights`."""
    return {name: float(layer.scaling[ADAPTER]) for name, layer in lora_layers(module)}


@contextmanager
def adapters_disabled(module: nn.Module) -> Iterator[None]:
    """The base model for the block: every LoRA layer computes W x only (the reference policy of a LoRA actor)."""
    layers = [layer for _, layer in lora_layers(module)]
    # PEFT also freezes disabled adapters; FSDP fixes its gradient dtypes from what is trainable at the first
    # forward, which may be this one, so every parameter keeps its flag
    trainable = [(param, param.requires_grad) for param in module.parameters()]
    for layer in layers:
        layer.enable_adapters(False)
    for param, flag in trainable:
        param.requires_grad_(flag)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for param, flag in trainable:
            param.requires_grad_(flag)


@contextmanager
def merged_for_generation(module: nn.Module, in_place: bool = False) -> Iterator[None]:
    """Plain linears holding W + (alpha/r) B A in place of the LoRA layers for the (no-grad) block; the LoRA
    layers return after, with their weights bit for bit unless `in_place`, which adds into the weights and
    leaves them merged: only for a temporary gathered copy (FSDP's `summon_full_params`)."""
    swapped: list[tuple[nn.Module, str, nn.Module, nn.Parameter, torch.Tensor]] = []
    try:
        for name, layer in lora_layers(module):
            parent_name, _, attr = name.rpartition(".")
            parent = module.get_submodule(parent_name)
            base = layer.get_base_layer()
            weight = base.weight
            original = weight.data
            delta = layer.get_delta_weight(ADAPTER).to(original.dtype)
            if in_place:
                original.add_(delta)
            else:
                weight.data = original + delta
            setattr(parent, attr, base)
            swapped.append((parent, attr, layer, weight, original))
        yield
    finally:
        for parent, attr, layer, weight, original in reversed(swapped):
            weight.data = original
            setattr(parent, attr, layer)


def merged_weights(named_tensors: Iterable[tuple[str, torch.Tensor]],
                   scalings: dict[str, float]) -> Iterator[tuple[str, torch.Tensor]]:
    """A LoRA model's full tensors, in order, under the plain model's names: for each LoRA layer `p` (a key of
    `scalings`) `p.weight = p.base_layer.weight + scaling * lora_B @ lora_A`; other tensors pass through."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named_tensors:
        layer, part = _lora_part(name, scalings)
        if layer is None:
            yield name, tensor
            continue
        if part == "bias":
            yield f"{layer}.bias", tensor
            continue
        parts = pending.setdefault(layer, {})
        parts[part] = tensor
        if len(parts) == 3:
            del pending[layer]
            base = parts["weight"]
            delta = (parts["lora_B"].float() @ parts["lora_A"].float()) * scalings[layer]
            yield f"{layer}.weight", (base.float() + delta).to(base.dtype)
    if pending:
        raise LoRAError(f"LoRA layers without all of base weight, lora_A and lora_B: {sorted(pending)[:3]}")


def _lora_part(name: str, scalings: dict[str, float]) -> tuple[str | None, str | None]:
    """(layer, part) for a tensor of a LoRA layer: part is weight / bias (of its base layer), lora_A, lora_B."""
    for marker, part in ((".base_layer.weight", "weight"), (".base_layer.bias", "bias"),
                         (f".lora_A.{ADAPTER}.weight", "lora_A"), (f".lora_B.{ADAPTER}.weight", "lora_B")):
        if name.endswith(marker):
            layer = name[: -len(marker)]
            if layer in scalings:
                return layer, part
    return None, None


def adapter_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The adapter matrices among a model's tensors, under the model's names."""
    return {name: tensor for name, tensor in named_tensors if _is_adapter_name(name)}


def save_adapter(out_dir: str | Path, adapters: dict[str, torch.Tensor], module: nn.Module,
                 base_model_path: str | None) -> Path:
    """Write a PEFT adapter directory (config + safetensors) from the model-named adapter tensors."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = module.peft_config[ADAPTER]
    config.base_model_name_or_path = base_model_path
    config.inference_mode = True
    config.save_pretrained(str(out))
    # a PEFT adapter file names tensors `base_model.model.<p>.lora_A.weight`
    state = {_PEFT_PREFIX + name.replace(f".{ADAPTER}.", "."): t.contiguous() for name, t in adapters.items()}
    save_file(state, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    return out


def read_adapter(adapter_dir: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(adapter_config.json, tensors under the model's names) of a PEFT adapter directory."""
    from safetensors.torch import load_file

    directory = Path(adapter_dir)
    config = json.loads((directory / ADAPTER_CONFIG).read_text())
    tensors = {}
    for name, tensor in load_file(str(directory / ADAPTER_WEIGHTS)).items():
        if not name.startswith(_PEFT_PREFIX) or not name.endswith((".lora_A.weight", ".lora_B.weight")):
            raise LoRAError(f"{directory / ADAPTER_WEIGHTS}: tensor {name!r} is not a LoRA matrix of a "
                            f"PEFT adapter (expected {_PEFT_PREFIX}<module>.lora_A.weight / .lora_B.weight)")
        stem, _, matrix = name[len(_PEFT_PREFIX):].rpartition(".lora_")
        tensors[f"{stem}.lora_{matrix.split('.')[0]}.{ADAPTER}.weight"] = tensor
    return config, tensors


def load_adapter_weights(model: nn.Module, adapter_dir: str | Path) -> None:
    """Copy a PEFT adapter directory's matrices into `model`'s LoRA layers; every one must match."""
    _, tensors = read_adapter(adapter_dir)
    params = dict(model.named_parameters())
    wanted = {name for name in params if _is_adapter_name(name)}
    missing, unexpected = sorted(wanted - tensors.keys()), sorted(tensors.keys() - wanted)
    if missing or unexpected:
        raise LoRAError(f"adapter {adapter_dir} does not fit this model: missing {missing[:3]}, unexpected "
                        f"{unexpected[:3]} (was it trained on another base model?)")
    with torch.no_grad():
        for name, tensor in tensors.items():
            if params[name].shape != tensor.shape:
                raise LoRAError(f"adapter {adapter_dir}: {name} has shape {tuple(tensor.shape)}, the model's is "
                                f"{tuple(params[name].shape)}")
            params[name].copy_(tensor)


def merge_into_base(base: dict[str, torch.Tensor], adapters: dict[str, torch.Tensor],
                    adapter_config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A plain model's state dict `base` with the model-named `adapters` merged in: for each adapted layer `p`,
    `p.weight + (alpha / r) * lora_B @ lora_A` (alpha/sqrt(r) with rslora; alpha and r from `adapter_config`)."""
    layers = sorted({name.rsplit(".lora_", 1)[0] for name in adapters})
    missing = [layer for layer in layers if f"{layer}.weight" not in base]
    if missing:
        raise LoRAError(f"the adapter adapts {missing[:3]}, which the base model does not have (another base?)")
    rank, alpha = adapter_config["r"], adapter_config["lora_alpha"]
    if adapter_config.get("rank_pattern") or adapter_config.get("alpha_pattern"):
        raise LoRAError("adapters with rank_pattern / alpha_pattern (per-layer ranks) are not supported")
    scale = alpha / (rank ** 0.5 if adapter_config.get("use_rslora") else rank)
    adapted = {f"{layer}.weight": f"{layer}.base_layer.weight" for layer in layers}  # as a LoRA model names them
    stream = [(adapted.get(name, name), tensor) for name, tensor in base.items()]
    return dict(merged_weights([*stream, *adapters.items()], dict.fromkeys(layers, scale)))
