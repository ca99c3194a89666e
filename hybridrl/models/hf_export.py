"""Build a Hugging Face model around a full state dict and save it as a plain model directory.

Two writers share it: a checkpoint that saves `hf_model` (`hybridrl/workers/checkpoint.py`) and the
merger that turns a sharded checkpoint into a model directory afterwards (`hybridrl/model_merger.py`).
It knows nothing of the checkpoint layout, so both can import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
import transformers
from transformers import PretrainedConfig, PreTrainedModel


class ModelExportError(ValueError):
    """The tensors do not fit the model the config describes (or transformers lacks its architecture)."""


def build_hf_model(state_dict: Mapping[str, torch.Tensor], config: PretrainedConfig) -> PreTrainedModel:
    """The model class named by `config.architectures`, holding exactly `state_dict`'s tensors.

    The module is built on the meta device and the tensors are assigned, not copied, so a 7B model costs
    one copy of its weights in memory. Tied input/output embeddings (Qwen2's small models) arrive as two
    equal entries (`lm_head.weight` and `model.embed_tokens.weight`): they are checked equal and re-tied.
    """
    architecture = (getattr(config, "architectures", None) or ["AutoModelForCausalLM"])[0]
    model_cls = getattr(transformers, architecture, None)
    if model_cls is None:
        raise ModelExportError(
            f"config.architectures names {architecture!r}, which transformers {transformers.__version__} "
            "does not provide"
        )
    with torch.device("meta"):
        model = model_cls._from_config(config) if hasattr(model_cls, "_from_config") else \
            model_cls.from_config(config)
    result = model.load_state_dict(dict(state_dict), strict=False, assign=True)
    tied = _tied_pairs(model) if getattr(config, "tie_word_embeddings", False) else {}
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise ModelExportError(
            f"the checkpoint does not match {architecture}: missing {missing[:5]}, unexpected "
            f"{result.unexpected_keys[:5]} (was it saved from a different model, or is the config wrong?)"
        )
    for out_key, in_key in tied.items():
        if out_key in state_dict and not torch.equal(state_dict[out_key], state_dict[in_key]):
            raise ModelExportError(
                f"config.tie_word_embeddings is true but {out_key} differs from {in_key} in the checkpoint"
            )
    model.tie_weights()
    return model


def _tied_pairs(model: PreTrainedModel) -> dict[str, str]:
    """{output embedding key: input embedding key} for a model whose config ties them."""
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    if out_emb is None or in_emb is None:
        return {}
    names = {id(module): name for name, module in model.named_modules()}
    return {f"{names[id(out_emb)]}.weight": f"{names[id(in_emb)]}.weight"}


def save_hf_model(state_dict: Mapping[str, torch.Tensor], config: PretrainedConfig, out_dir: str | Path) -> None:
    """Write `state_dict` as `model.safetensors` + `config.json` into `out_dir`."""
    build_hf_model(state_dict, config).save_pretrained(out_dir, safe_serialization=True)
