"""Turn a sharded training checkpoint into a plain Hugging Face model directory.

    python -m hybridrl.model_merger --local_dir checkpoints/run/global_step_100/actor --target_dir merged/
    python -m hybridrl.model_merger merge --backend fsdp --local_dir ... --target_dir ...   # verl's spelling

`--local_dir` is one role's checkpoint, saved by any number of ranks; config and tokenizer come from its
`huggingface/` folder, else from `--hf_model_path`. A LoRA checkpoint's adapters are merged into the base
model it names (or `--hf_model_path`), and copied as `<target_dir>/lora_adapter/`.
"""

from __future__ import annotations

import argparse
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

from transformers import AutoConfig

from hybridrl.models.loading import TOKENIZER_FILES, ModelExportError, load_causal_lm, save_hf_model
from hybridrl.models.lora import ADAPTER_SUBDIR, LoRAError, merge_into_base, read_adapter
from hybridrl.workers.checkpoint import HF_SUBDIR, CheckpointError, check_role_dir, read_full_model_state

logger = logging.getLogger(__name__)

# Everything else in a HF directory is copied verbatim, so the merged model tokenizes as training did.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")


def _copy_aux_files(source: Path, target: Path, overwrite: bool = True) -> list[str]:
    """Copy tokenizer files, chat template and generation config (not weights, not config.json)."""
    copied = []
    for path in sorted(source.iterdir()):
        if not path.is_file() or path.name == "config.json" or path.name.endswith(_WEIGHT_SUFFIXES):
            continue
        if overwrite or not (target / path.name).exists():
            shutil.copy2(path, target / path.name)
            copied.append(path.name)
    return copied


def _config_source(local_dir: Path, hf_model_path: str | Path | None) -> Path:
    saved = local_dir / HF_SUBDIR
    if (saved / "config.json").is_file():
        return saved
    if hf_model_path is None:
        raise CheckpointError(f"{saved} has no config.json, so the model architecture is unknown; pass "
                              "--hf_model_path with the base model's directory (the one training started "
                              "from) to take config and tokenizer from there")
    source = Path(hf_model_path)
    if not (source / "config.json").is_file():
        raise CheckpointError(f"--hf_model_path {source} has no config.json")
    return source


def merge_checkpoint(local_dir: str | Path, target_dir: str | Path,
                     hf_model_path: str | Path | None = None) -> Path:
    """Write the full model of checkpoint `local_dir` as a Hugging Face directory at `target_dir`."""
    local = Path(local_dir)
    meta = check_role_dir(local)
    if "model" not in meta["contents"]:
        raise CheckpointError(f"{local} was saved without model weights (contents={meta['contents']}); "
                              "save with 'model' in checkpoint.save_contents")
    source = _config_source(local, hf_model_path)
    config = AutoConfig.from_pretrained(source, local_files_only=True)
    state_dict = read_full_model_state(local)
    target = Path(target_dir)
    target.mkdir(parents=True, exist_ok=True)
    if "lora" in meta:
        state_dict = _merge_lora(local, meta, state_dict, hf_model_path, target)
    try:
        save_hf_model(state_dict, config, target)
    except ModelExportError as err:
        raise CheckpointError(f"{local}: {err}") from err
    copied = _copy_aux_files(source, target)  # after save_pretrained: the saved generation config wins
    has_tokenizer = any((target / name).is_file() for name in TOKENIZER_FILES)
    if not has_tokenizer and hf_model_path is not None:  # fill in only what the checkpoint lacked
        copied += _copy_aux_files(Path(hf_model_path), target, overwrite=False)
    elif not has_tokenizer:
        logger.warning("%s has no tokenizer files; pass --hf_model_path to copy them from the base model", source)
    logger.info("merged %s (%d tensors, saved by %d ranks) into %s; copied %s", local, len(state_dict),
                meta["world_size"], target, ", ".join(copied) or "no tokenizer files")
    return target


def _merge_lora(local: Path, meta: dict, adapters: dict, hf_model_path: str | Path | None, target: Path) -> dict:
    """The base model with the checkpoint's adapters merged in; the adapter directory copied to the target."""
    base_path = hf_model_path or meta["lora"].get("base_model_path")
    if not base_path or not Path(base_path).is_dir():
        raise CheckpointError(f"{local} holds LoRA adapters of the base model {base_path!r}, which is not a "
                              "directory here; pass --hf_model_path with the base model's directory")
    adapter_config, _ = read_adapter(local / ADAPTER_SUBDIR)
    base = load_causal_lm(base_path).state_dict()
    try:
        merged = merge_into_base(base, adapters, adapter_config)
    except LoRAError as err:
        raise CheckpointError(f"{local}: {err}") from err
    shutil.copytree(local / ADAPTER_SUBDIR, target / ADAPTER_SUBDIR, dirs_exist_ok=True)
    return merged


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hybridrl.model_merger", description=__doc__.split("\n")[0])
    parser.add_argument("operation", nargs="?", default="merge", choices=["merge"],
                        help="kept for verl's `model_merger merge ...` spelling; merge is the only operation")
    parser.add_argument("--backend", default="fsdp", choices=["fsdp"], help="checkpoint format (FSDP2 + DCP)")
    parser.add_argument("--local_dir", required=True, help="a role's checkpoint, e.g. .../global_step_N/actor")
    parser.add_argument("--target_dir", required=True, help="where to write the Hugging Face model")
    parser.add_argument("--hf_model_path", default=None,
                        help="model directory to take config/tokenizer from when the checkpoint lacks them")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        merge_checkpoint(args.local_dir, args.target_dir, args.hf_model_path)
    except CheckpointError as err:
        parser.exit(2, f"error: {err}\n")


if __name__ == "__main__":
    main()
