"""Model loading from local Hugging Face checkpoints (`loading`) and the offline tiny model factory (`tiny`,
not imported here: as a command, runpy would warn that it was already loaded)."""

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

__all__ = ["ModelDirectoryError", "apply_override_config", "check_model_dir", "load_causal_lm",
           "load_model_config", "load_tokenizer", "load_value_model", "padding_side", "resolve_dtype",
           "resolve_model_dir"]
