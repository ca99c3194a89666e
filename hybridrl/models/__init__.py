"""Model loading from local Hugging Face checkpoints, and the offline tiny model + tokenizer factory."""

from hybridrl.models.loading import (
    ModelDirectoryError,
    apply_override_config,
    check_model_dir,
    load_causal_lm,
    load_model_config,
    load_tokenizer,
    load_value_model,
    padding_side,
    resolve_dtype,
    resolve_model_dir,
)
from hybridrl.models.tiny import build_tiny_model, count_parameters

__all__ = [
    "ModelDirectoryError",
    "apply_override_config",
    "build_tiny_model",
    "check_model_dir",
    "count_parameters",
    "load_causal_lm",
    "load_model_config",
    "load_tokenizer",
    "load_value_model",
    "padding_side",
    "resolve_dtype",
    "resolve_model_dir",
]
