"""Checkpoints of a worker role, in verl's layout under `trainer.default_local_dir`:

    latest_checkpointed_iteration.txt       the newest committed step N
    global_step_N/
        checkpoint_complete.json            step marker, written by commit_checkpoint
        actor/, critic/                     one CheckpointManager per role, one per rank
            .metadata, __<rank>_0.distcp    model + optimizer + lr scheduler (loads at any world size)
            extra_state_world_size_W_rank_R.pt   RNG states of rank R
            huggingface/                    config, generation config, tokenizer (+ weights with "hf_model")
            lora_adapter/                   a LoRA model's adapters as a PEFT adapter directory
            hybridrl_checkpoint.json        role marker, written last
        data.pt, run_config.json            the trainer's own state and the run's config

A role is written to `<role>.tmp-<id>` and renamed once every rank finished, and only committed steps
count, so a save that dies at any point leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.fsdp import FSDPModule

from hybridrl.models.loading import save_hf_model
from hybridrl.models.lora import ADAPTER_SUBDIR, save_adapter
from hybridrl.utils.device import device_type
from hybridrl.workers.config import CheckpointConfig, to_dataclass

logger = logging.getLogger(__name__)

TRACKER_FILE = "latest_checkpointed_iteration.txt"
STEP_MARKER = "checkpoint_complete.json"
ROLE_MARKER = "hybridrl_checkpoint.json"
HF_SUBDIR = "huggingface"
TMP_TAG = ".tmp-"
STEP_DIR = re.compile(r"^global_step_(\d+)$")
CONTENTS = ("model", "optimizer", "extra", "hf_model")


class CheckpointError(RuntimeError):
    """A checkpoint directory that is missing, incomplete or does not hold what was asked for."""


def resolve_contents(config: CheckpointConfig | Mapping[str, Any] | None) -> tuple[list[str], list[str]]:
    """(save_contents, load_contents) of a `checkpoint` config node, checked; load follows save unless set."""
    config = to_dataclass(CheckpointConfig, config)
    save = list(config.save_contents)
    load = save if config.load_contents is None else list(config.load_contents)
    for key, values in (("save_contents", save), ("load_contents", load)):
        unknown = sorted(set(values) - set(CONTENTS))
        if unknown:
            raise ValueError(f"checkpoint.{key} has unknown entries {unknown}; valid: {list(CONTENTS)}")
    return save, load


# ----- process-group helpers (a world of one when torch.distributed is not initialised) ---------------
def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _gather_str(value: str) -> list[str]:
    """Every rank's `value`, in rank order (a collective; `[value]` without a process group)."""
    if not dist.is_initialized():
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


@contextlib.contextmanager
def _dcp_options(one_process: bool = False) -> Iterator[dict[str, bool]]:
    """DCP's keyword arguments: `no_dist=True` (its warning silenced) on one rank or for `one_process` work,
    where DCP's planning collectives would leave an OpenMP team behind that slows every later op."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        yield {"no_dist": True} if one_process or _world_size() == 1 else {}


def _write_durably(path: Path, text: str) -> None:
    """Write via a temporary file, fsync, and rename, so readers see the whole file or none of it."""
    tmp = path.with_name(path.name + TMP_TAG + uuid.uuid4().hex[:8])
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # makes the rename itself durable
    finally:
        os.close(fd)


def get_rng_state() -> dict[str, Any]:
    """This process's RNG states, as tensors and tuples `torch.load(weights_only=True)` reads."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)),
        "torch": torch.get_rng_state(),
    }
    if device_type() == "cuda":  # a CPU rank on a GPU machine leaves CUDA (and its contexts) alone
        # the rank's own device only: `get_rng_state_all` would open a context on every visible GPU
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device_type() == "cuda":
        cuda_state = state["cuda"]
        if isinstance(cuda_state, list | tuple):  # checkpoints written before one device per rank
            index = torch.cuda.current_device()
            cuda_state = cuda_state[index] if index < len(cuda_state) else None
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state)


def load_state_file(path: Path, weights_only: bool = True) -> Any:
    """`torch.load(path)`, or a CheckpointError naming the file and the cause."""
    try:
        return torch.load(path, weights_only=weights_only)
    except Exception as err:
        raise CheckpointError(f"could not read {path}: {type(err).__name__}: {err}") from err


def _extra_file(path: Path, world_size: int, rank: int) -> Path:
    return path / f"extra_state_world_size_{world_size}_rank_{rank}.pt"


def check_role_dir(path: str | Path) -> dict[str, Any]:
    """The role marker of a finished checkpoint at `path`; raises CheckpointError saying what is wrong."""
    path = Path(path)
    if TMP_TAG in path.name:
        raise CheckpointError(f"{path} is a temporary directory of a save that did not finish")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    marker = path / ROLE_MARKER
    if not marker.is_file():
        raise CheckpointError(f"{path} is incomplete: it has no {ROLE_MARKER}, which a save writes last (the "
                              "save was interrupted, or this is not a hybridrl checkpoint)")
    return json.loads(marker.read_text())


def _step_of(path: Path) -> int | None:
    match = STEP_DIR.match(path.name)
    return int(match.group(1)) if match else None


def step_dir_problem(step_dir: str | Path) -> str | None:
    """None if `global_step_N` was committed and all its roles are complete, else what is wrong."""
    step_dir = Path(step_dir)
    if not step_dir.is_dir():
        return f"{step_dir} does not exist"
    marker = step_dir / STEP_MARKER
    if not marker.is_file():
        return f"{step_dir} was never committed (no {STEP_MARKER}): the run stopped while saving it"
    for role in json.loads(marker.read_text())["roles"]:
        try:
            check_role_dir(step_dir / role)
        except CheckpointError as err:
            return str(err)
    return None


def read_tracker(default_local_dir: str | Path) -> int | None:
    tracker = Path(default_local_dir) / TRACKER_FILE
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if not text.isdigit():
        logger.warning("%s holds %r, not a step number; ignoring it", tracker, text)
        return None
    return int(text)


def _step_dirs(default_local_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every global_step_N directory, newest first."""
    if not default_local_dir.is_dir():
        return []
    found = [(_step_of(p), p) for p in default_local_dir.iterdir() if p.is_dir()]
    return sorted(((s, p) for s, p in found if s is not None), reverse=True)


def commit_checkpoint(default_local_dir: str | Path, global_step: int) -> Path:
    """Point the tracker at `global_step_N` and mark it complete, once all roles saved (CheckpointError if
    one is incomplete). The tracker goes first: a death between the writes never commits a step above it."""
    root = Path(default_local_dir)
    step_dir = root / f"global_step_{global_step}"
    roles = sorted(p.name for p in step_dir.iterdir() if p.is_dir() and TMP_TAG not in p.name) \
        if step_dir.is_dir() else []
    if not roles:
        raise CheckpointError(f"{step_dir} holds no saved role; save the workers' checkpoints first")
    for role in roles:
        check_role_dir(step_dir / role)
    _write_durably(root / TRACKER_FILE, str(global_step))
    _write_durably(step_dir / STEP_MARKER, json.dumps({"global_step": global_step, "roles": roles}, indent=2))
    return step_dir


def prune_checkpoints(default_local_dir: str | Path, role: str, keep: int, current_step: int) -> list[Path]:
    """Delete this role's oldest complete checkpoints so that `keep` remain (the current one included),
    never the tracker's step nor steps after `current_step`; a step directory left with no role goes too."""
    root = Path(default_local_dir)
    protected = read_tracker(root)
    saved = [(s, p) for s, p in _step_dirs(root) if s <= current_step and (p / role / ROLE_MARKER).is_file()]
    removed = []
    for step, step_dir in saved[keep:]:
        if step == protected:
            continue
        shutil.rmtree(step_dir / role)
        removed.append(step_dir / role)
        # another role's manager may be pruning the same step right now: tolerate its deletions
        with contextlib.suppress(FileNotFoundError):
            if not any(p.is_dir() and TMP_TAG not in p.name for p in step_dir.iterdir()):
                shutil.rmtree(step_dir, ignore_errors=True)
    return removed


def shard_problems(path: str | Path) -> list[str]:
    """Files of the DCP checkpoint at `path` missing or shorter than its `.metadata` says (DCP names none)."""
    path = Path(path)
    try:
        metadata = FileSystemReader(str(path)).read_metadata()
    except Exception as err:
        return [f"{path / '.metadata'} cannot be read: {type(err).__name__}: {err}"]
    extent: dict[str, int] = {}  # file -> bytes it must hold (the end of its last item)
    for info in (metadata.storage_data or {}).values():
        extent[info.relative_path] = max(extent.get(info.relative_path, 0), info.offset + info.length)
    problems = []
    for name, size in sorted(extent.items()):
        file = path / name
        if not file.is_file():
            problems.append(f"{file} is missing")
        elif file.stat().st_size < size:
            problems.append(f"{file} is truncated: {file.stat().st_size} bytes, but .metadata places data up "
                            f"to byte {size}")
    return problems


def read_full_model_state(path: str | Path) -> dict[str, torch.Tensor]:
    """Full (unsharded) model tensors of a role checkpoint, assembled in this process from any world size."""
    metadata = FileSystemReader(str(path)).read_metadata()
    prefix = "model."
    state = {key: torch.empty(meta.size, dtype=meta.properties.dtype)  # the global (unsharded) shape
             for key, meta in metadata.state_dict_metadata.items()
             if key.startswith(prefix) and hasattr(meta, "size")}
    if not state:
        raise CheckpointError(f"{path} holds no model tensors")
    with _dcp_options(one_process=True) as dcp_options:
        dcp.load(state, storage_reader=FileSystemReader(str(path)), **dcp_options)
    return {key[len(prefix):]: value for key, value in state.items()}


class CheckpointManager:
    """Saves and restores one role's engine (model, optimizer, scheduler), RNG states, tokenizer and HF files;
    one per role on every rank, a collective. A LoRA engine's "model" is its adapters (plus a PEFT adapter
    directory naming `base_model_path`) and its "hf_model" the merged model."""

    def __init__(self, engine: Any, processing_class: Any = None,
                 checkpoint_config: CheckpointConfig | Mapping[str, Any] | None = None,
                 base_model_path: str | None = None) -> None:
        self.engine = engine
        self.processing_class = processing_class
        self.base_model_path = base_model_path
        self.save_contents, self.load_contents = resolve_contents(checkpoint_config)
        if "optimizer" in self.save_contents and engine.optimizer is None:
            raise ValueError("checkpoint.save_contents has 'optimizer' but this engine has no optimizer "
                             "(a reference model?); save ['model'] only")

    def save_checkpoint(self, local_path: str | Path, global_step: int,
                        max_ckpt_to_keep: int | None = None) -> None:
        """Write this role's checkpoint to `local_path` (e.g. `.../global_step_N/actor`) from all ranks."""
        final = Path(local_path)
        tmp = final.with_name(_gather_str(final.name + TMP_TAG + uuid.uuid4().hex[:8])[0])  # rank 0's name
        if _rank() == 0:
            self._prepare(final, tmp)
        _barrier()
        contents = self.save_contents
        if "extra" in contents:
            torch.save(get_rng_state(), _extra_file(tmp, _world_size(), _rank()))
        if "model" in contents or "optimizer" in contents:
            with _dcp_options() as dcp_options:
                dcp.save(_selected(self.engine.sharded_state(), contents), checkpoint_id=str(tmp), **dcp_options)
        self._save_hf_files(tmp / HF_SUBDIR, with_weights="hf_model" in contents)
        lora = self.engine.has_lora
        if lora and "model" in contents:
            adapters = self.engine.full_adapter_state_dict()  # a collective
            if _rank() == 0:
                save_adapter(tmp / ADAPTER_SUBDIR, adapters, self.engine.module, self.base_model_path)
        _barrier()  # every rank's files are on disk before the directory may look complete
        if _rank() == 0:
            _write_durably(tmp / ROLE_MARKER, json.dumps({
                "global_step": global_step, "world_size": _world_size(), "contents": list(contents),
                "format": "torch.distributed.checkpoint", "torch_version": torch.__version__,
                **({"lora": {"base_model_path": self.base_model_path}} if lora else {}),
            }, indent=2))
            self._publish(tmp, final)
            root, step = final.parent.parent, _step_of(final.parent)
            if max_ckpt_to_keep and max_ckpt_to_keep > 0 and step is not None:
                removed = prune_checkpoints(root, final.name, max_ckpt_to_keep, step)
                logger.info("removed old checkpoints: %s", [str(p) for p in removed])
        _barrier()

    @staticmethod
    def _prepare(final: Path, tmp: Path) -> None:
        """Rank 0: un-commit the step being (re)written, clear crashed saves' leftovers, make the temp dir."""
        step_dir = final.parent
        step_dir.mkdir(parents=True, exist_ok=True)
        (step_dir / STEP_MARKER).unlink(missing_ok=True)  # a half-rewritten step must not look complete
        for stale in step_dir.glob(final.name + TMP_TAG + "*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()

    @staticmethod
    def _publish(tmp: Path, final: Path) -> None:
        """Rank 0: swap the finished temp dir in; an older copy of the same step is deleted only after."""
        old = None
        if final.exists():
            old = final.with_name(final.name + TMP_TAG + "old-" + uuid.uuid4().hex[:8])
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(final.parent)
        if old is not None:
            shutil.rmtree(old)

    def _save_hf_files(self, out_dir: Path, with_weights: bool) -> None:
        module = self.engine.module
        full = self.engine.full_model_state_dict() if with_weights else None  # a collective
        if _rank() != 0:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        config = module.config.__class__.from_dict(module.config.to_dict())
        config.architectures = [_hf_class_name(module)]
        if full is not None:
            save_hf_model(full, config, out_dir)
        config.save_pretrained(out_dir)
        generation_config = getattr(module, "generation_config", None)
        if generation_config is not None:
            generation_config.save_pretrained(out_dir)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(out_dir)

    def load_checkpoint(self, local_path: str | Path) -> dict[str, Any]:
        """Restore `checkpoint.load_contents` from the role checkpoint at `local_path`; returns its marker. A
        read failure raises CheckpointError, on every rank, naming each failing rank's error."""
        meta = check_role_dir(local_path)
        wanted = [c for c in self.load_contents if c != "hf_model"]
        saved_lora, lora = "lora" in meta, self.engine.has_lora
        if saved_lora != lora and "model" in wanted:
            raise CheckpointError(
                f"{local_path} holds {'LoRA adapters' if saved_lora else 'a full model'}, but this run "
                f"{'trains LoRA adapters' if lora else 'has no LoRA adapters'}: set actor_rollout_ref.model."
                f"lora_rank as the run that saved it did (or merge it with python -m hybridrl.model_merger and "
                f"start from the merged model)")
        absent = [c for c in wanted if c not in meta["contents"]]
        if absent:
            raise CheckpointError(f"checkpoint.load_contents asks for {absent}, but {local_path} was saved "
                                  f"with {meta['contents']}; drop them from load_contents")
        error = ""
        try:
            self._load_files(Path(local_path), wanted, meta)
        except (Exception, CheckpointException) as err:  # DCP's CheckpointException is a BaseException
            error = _describe_load_error(err)
        errors = _gather_str(error)  # a collective: every rank learns whether any rank failed
        if any(errors):
            by_error: dict[str, list[str]] = {}
            for rank, e in enumerate(errors):
                if e:
                    by_error.setdefault(e, []).append(str(rank))
            failures = "; ".join(f"rank {', '.join(ranks)}: {e}" for e, ranks in by_error.items())
            raise CheckpointError(f"could not read the checkpoint {local_path}: {failures}")
        return meta

    def _load_files(self, path: Path, wanted: list[str], meta: dict[str, Any]) -> None:
        if "model" in wanted or "optimizer" in wanted:
            problems = shard_problems(path)
            if problems:  # DCP's own error would name neither the file nor the cause
                raise CheckpointError("; ".join(problems))
            state = self.engine.sharded_state()  # the target layout of this run's shards
            to_read = _selected(state, wanted)
            with _dcp_options() as dcp_options:
                dcp.load(to_read, checkpoint_id=str(path), **dcp_options)
            state.update(to_read)
            self.engine.load_sharded_state(state if "optimizer" in wanted else {"model": state["model"]})
        if "extra" in wanted:
            if meta["world_size"] == _world_size():
                set_rng_state(load_state_file(_extra_file(path, _world_size(), _rank())))
            else:
                logger.warning("checkpoint %s was saved by %d ranks, this run has %d: model and optimizer are "
                               "resharded, but per-rank RNG states are not restored", path,
                               meta["world_size"], _world_size())

def _selected(state: dict[str, Any], contents: Iterable[str]) -> dict[str, Any]:
    """The parts of an engine state `contents` names: "model", and with "optimizer" the rest (the scheduler)."""
    return {k: v for k, v in state.items() if ("model" if k == "model" else "optimizer") in contents}


def _describe_load_error(err: BaseException) -> str:
    """One line per cause: DCP gathers every rank's exception into one CheckpointException."""
    if isinstance(err, CheckpointException):
        return "; ".join(f"{type(e).__name__}: {e}" for e, _trace in err.failures.values())
    return f"{type(err).__name__}: {err}"


def _hf_class_name(module: torch.nn.Module) -> str:
    """The HF model class under FSDP2's wrapper (fully_shard swaps in a subclass named FSDP<Class>)."""
    return next(cls.__name__ for cls in type(module).__mro__ if not issubclass(cls, FSDPModule))
