"""Load local Hugging Face checkpoints (causal LMs; value models for critics and reward models) and save state
dicts as model directories. Offline only: a path is a local directory or a repo id already in the HF cache; a
missing or malformed directory raises `ModelDirectoryError` naming what is missing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from hybridrl.models import attention  # noqa: F401 - registers attn_implementation='grouped_eager'
from hybridrl.utils.device import AUTO, BF16_NAMES, auto_dtype
from hybridrl.utils.registry import Registry


class ModelExportError(ValueError):
    """The tensors do not fit the model the config describes (or transformers lacks its architecture)."""


def build_hf_model(state_dict: Mapping[str, torch.Tensor], config: PretrainedConfig) -> PreTrainedModel:
    """The model class named by `config.architectures`, holding exactly `state_dict`'s tensors, assigned
    (not copied) on the meta device. Tied embeddings arrive as two entries, which must be equal."""
    architecture = (getattr(config, "architectures", None) or ["AutoModelForCausalLM"])[0]
    model_cls = getattr(transformers, architecture, None)
    if model_cls is None:
        raise ModelExportError(f"config.architectures names {architecture!r}, which transformers "
                               f"{transformers.__version__} does not provide")
    with torch.device("meta"):
        model = model_cls._from_config(config) if hasattr(model_cls, "_from_config") else \
            model_cls.from_config(config)
    result = model.load_state_dict(dict(state_dict), strict=False, assign=True)
    tied: dict[str, str] = {}  # {output embedding key: input embedding key} where the config ties them
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    if getattr(config, "tie_word_embeddings", False) and out_emb is not None and in_emb is not None:
        names = {id(module): name for name, module in model.named_modules()}
        tied = {f"{names[id(out_emb)]}.weight": f"{names[id(in_emb)]}.weight"}
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise ModelExportError(f"the checkpoint does not match {architecture}: missing {missing[:5]}, "
                               f"unexpected {result.unexpected_keys[:5]} (was it saved from a different "
                               f"model, or is the config wrong?)")
    for out_key, in_key in tied.items():
        if out_key in state_dict and not torch.equal(state_dict[out_key], state_dict[in_key]):
            raise ModelExportError(f"config.tie_word_embeddings is true but {out_key} differs from {in_key} "
                                   f"in the checkpoint")
    model.tie_weights()
    return model


def save_hf_model(state_dict: Mapping[str, torch.Tensor], config: PretrainedConfig, out_dir: str | Path) -> None:
    """Write `state_dict` as `model.safetensors` + `config.json` into `out_dir`."""
    build_hf_model(state_dict, config).save_pretrained(out_dir, safe_serialization=True)


logger = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")

DTYPES: Registry[torch.dtype] = Registry("dtype")
for _names, _dtype in ((("float32", "fp32"), torch.float32), (BF16_NAMES, torch.bfloat16),
                       (("float16", "fp16"), torch.float16)):
    for _name in _names:
        DTYPES.add(_name, _dtype)


class ModelDirectoryError(OSError):
    """A model path that is not a usable local Hugging Face directory."""


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """`torch.float32` or one of its names ("float32", "fp32", "bf16", ...); "auto" is this process's device's
    compute dtype (`hybridrl.utils.device.auto_dtype`: bf16 on a bf16 GPU, else fp32)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None:
        raise ValueError(f"a compute dtype of None: the automatic value is {AUTO!r}; pass {AUTO!r} or a dtype name")
    return auto_dtype() if dtype == AUTO else DTYPES.get(dtype)


@contextmanager
def weights_in_dtype(module: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Swap every floating parameter's data for a copy in `dtype` (buffers untouched), and put the originals
    back bit for bit after; the Parameter objects stay (optimizer and FSDP hold them), tied weights tied."""
    originals: list[tuple[nn.Parameter, torch.Tensor]] = []
    try:
        for param in module.parameters():
            if param.is_floating_point() and param.dtype != dtype:
                originals.append((param, param.data))
                param.data = param.data.to(dtype)
        yield
    finally:
        for param, data in originals:
            param.data = data


def resolve_model_dir(path: str | Path) -> Path:
    """The local directory for `path`: the path itself, or a repo id's snapshot in the local HF cache."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    if local.exists():
        raise ModelDirectoryError(f"model path {str(path)!r} is a file; expected a Hugging Face model "
                                  f"directory")
    text = str(path)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        from huggingface_hub import snapshot_download

        try:  # cache lookup only: local_files_only never opens a connection
            return Path(snapshot_download(text, local_files_only=True))
        except Exception as err:  # noqa: BLE001 - any failure means "not cached", reported below
            logger.debug("%s is not in the local Hugging Face cache: %s", text, err)
    raise ModelDirectoryError(
        f"model path {text!r} does not exist. hybridrl loads models only from local directories and never "
        "downloads; build a tiny one with `python -m hybridrl.models.tiny --out DIR` or download a "
        "checkpoint on a machine with network access (`huggingface-cli download REPO --local-dir DIR`)"
    )


def _read_config_json(model_dir: Path) -> dict[str, Any]:
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelDirectoryError(f"{model_dir} has no config.json, so it is not a Hugging Face model "
                                  f"directory")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise ModelDirectoryError(f"{config_path} is not valid JSON ({err})") from err
    if not isinstance(config, dict) or "model_type" not in config:
        raise ModelDirectoryError(f"{config_path} has no 'model_type' field, so transformers cannot pick a "
                                  f"model class")
    return config


def check_model_dir(model_dir: Path, *, need_weights: bool = True, need_tokenizer: bool = False) -> None:
    """Raise `ModelDirectoryError` naming what `model_dir` lacks: config, weights, shards or tokenizer."""
    _read_config_json(model_dir)
    if need_weights:
        present = [name for name in WEIGHT_FILES if (model_dir / name).is_file()]
        if not present:
            raise ModelDirectoryError(f"{model_dir} has no model weights: expected one of "
                                      f"{', '.join(WEIGHT_FILES)}")
        if present[0].endswith(".index.json"):
            index = json.loads((model_dir / present[0]).read_text())
            missing = sorted({s for s in index.get("weight_map", {}).values()
                              if not (model_dir / s).is_file()})
            if missing:
                raise ModelDirectoryError(f"{model_dir} lists weight shards that are missing: "
                                          f"{', '.join(missing)}")
    if need_tokenizer and not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise ModelDirectoryError(f"{model_dir} has no tokenizer: expected one of "
                                  f"{', '.join(TOKENIZER_FILES)}")


def apply_override_config(config: PretrainedConfig, override: Mapping[str, Any] | None) -> PretrainedConfig:
    """Set `override`'s entries on `config` in place (verl's `override_config`); nested dicts merge. A key the
    config lacks is still set, with a warning (usually a typo)."""
    for key, value in (override or {}).items():
        current = getattr(config, key, None)
        if isinstance(current, PretrainedConfig) and isinstance(value, Mapping):
            apply_override_config(current, value)
            continue
        if isinstance(current, dict) and isinstance(value, Mapping):
            value = {**current, **value}
        elif not hasattr(config, key):
            logger.warning("override_config sets %r, which %s did not have", key, type(config).__name__)
        setattr(config, key, value)
    return config


def load_model_config(path: str | Path, *, override_config: Mapping[str, Any] | None = None,
                      trust_remote_code: bool = False) -> PretrainedConfig:
    """The checkpoint's config with `override_config` applied."""
    model_dir = resolve_model_dir(path)
    _read_config_json(model_dir)
    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code, local_files_only=True)
    return apply_override_config(config, override_config)


def load_tokenizer(path: str | Path, *, padding_side: str | None = None,
                   trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer. A tokenizer without a pad token pads with its EOS token (as verl does)."""
    model_dir = resolve_model_dir(path)
    check_model_dir(model_dir, need_weights=False, need_tokenizer=True)
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, "local_files_only": True}
    if padding_side is not None:
        kwargs["padding_side"] = _check_side(padding_side)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, **kwargs)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise ModelDirectoryError(f"the tokenizer in {model_dir} has neither a pad token nor an EOS "
                                      f"token")
        logger.warning("tokenizer in %s has no pad token; padding with its EOS token %r", model_dir,
                       tokenizer.eos_token)
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _check_side(side: str) -> str:
    if side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
    return side


@contextmanager
def padding_side(tokenizer: PreTrainedTokenizerBase, side: str) -> Iterator[PreTrainedTokenizerBase]:
    """Temporarily pad on `side` ("left" for generation prompts); restores the previous side on exit."""
    previous = tokenizer.padding_side
    tokenizer.padding_side = _check_side(side)
    try:
        yield tokenizer
    finally:
        tokenizer.padding_side = previous


def _prepare(path: str | Path, dtype: str | torch.dtype, attn_implementation: str | None, trust_remote_code: bool,
             override_config: Mapping[str, Any] | None) -> tuple[Path, PretrainedConfig, dict[str, Any]]:
    """The checked model directory, its config with `override_config` applied, and from_pretrained's keywords."""
    model_dir = resolve_model_dir(path)
    check_model_dir(model_dir)
    config = load_model_config(model_dir, override_config=override_config, trust_remote_code=trust_remote_code)
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype), "trust_remote_code": trust_remote_code,
                              "local_files_only": True}
    # verl picks the attention through model.override_config; that choice wins over the caller's default
    attn_implementation = (override_config or {}).get("attn_implementation", attn_implementation)
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    return model_dir, config, kwargs


def _finish(model: PreTrainedModel, gradient_checkpointing: bool) -> PreTrainedModel:
    if gradient_checkpointing:
        # 5.x renamed it (the old name warns), 4.x has only the old; non-reentrant works with FSDP2
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False  # the KV cache cannot work with recomputed activations
    return model


def load_causal_lm(path: str | Path, *, dtype: str | torch.dtype = "float32",
                   attn_implementation: str | None = "sdpa", trust_remote_code: bool = False,
                   gradient_checkpointing: bool = False, override_config: Mapping[str, Any] | None = None
                   ) -> PreTrainedModel:
    """An `AutoModelForCausalLM` from a local checkpoint (actor, reference, rollout); an
    `attn_implementation` in `override_config` (verl's way) wins over the argument."""
    model_dir, config, kwargs = _prepare(path, dtype, attn_implementation, trust_remote_code, override_config)
    return _finish(AutoModelForCausalLM.from_pretrained(model_dir, config=config, **kwargs), gradient_checkpointing)


class BiasAddedLinear(nn.Linear):
    """An nn.Linear that adds its bias after the product, so its output owns its memory: torch's biased linear
    over (batch, seq, in) returns a view, which FSDP2 warns about. Equal up to the rounding of the add."""

    computes_plain_linear = True  # x @ W.T + b and nothing more (hybridrl/models/onednn_linear.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight)
        return out if self.bias is None else out + self.bias


def load_value_model(path: str | Path, *, dtype: str | torch.dtype = "float32",
                     attn_implementation: str | None = "sdpa", trust_remote_code: bool = False,
                     gradient_checkpointing: bool = False, override_config: Mapping[str, Any] | None = None,
                     head_init_seed: int = 0) -> PreTrainedModel:
    """A token-classification model with logits (batch, seq_len, 1), no dropout (critics, reward models), as
    verl builds it. An untrained head is drawn from `head_init_seed` (the caller's RNG untouched)."""
    model_dir, config, kwargs = _prepare(path, dtype, attn_implementation, trust_remote_code, override_config)
    config.num_labels = 1
    config.classifier_dropout = 0.0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(head_init_seed)
        model = AutoModelForTokenClassification.from_pretrained(model_dir, config=config, **kwargs)
    for name in ("score", "classifier"):  # the head's name in transformers' token-classification models
        head = getattr(model, name, None)
        if type(head) is nn.Linear:
            head.__class__ = BiasAddedLinear  # same parameters and hooks; the output is no longer a view
    return _finish(model, gradient_checkpointing)
