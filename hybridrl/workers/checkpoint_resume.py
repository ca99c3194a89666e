"""Which checkpoint a run resumes from, and what it may never overwrite: a committed step (its step marker,
every role's marker, the tracker at or above it; hybridrl/workers/checkpoint.py). A committed step that
fails to load is moved aside (`global_step_N.unloadable`) and the previous one is used.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from hybridrl.workers.checkpoint import (
    STEP_MARKER,
    TRACKER_FILE,
    CheckpointError,
    _fsync_dir,
    _step_dirs,
    _step_of,
    read_tracker,
    step_dir_problem,
)

logger = logging.getLogger(__name__)

UNLOADABLE_TAG = ".unloadable"  # suffix of a step directory that failed to load (see quarantine_step)


def _marked_steps(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of the step directories that carry a step marker, newest first."""
    return [(s, p) for s, p in _step_dirs(root) if (p / STEP_MARKER).is_file()]


def _names(paths: Iterable[Path]) -> str:
    return ", ".join(p.name for p in paths)


def auto_candidates(root: Path) -> Iterator[str]:
    """Committed, complete steps at or below the tracker, newest first (warning about each one skipped).
    CheckpointError when a step above the tracker was committed: no save leaves one there, so the tracker
    was moved back by hand, and resuming would overwrite those steps."""
    tracked = read_tracker(root)
    above = [p for s, p in _marked_steps(root) if tracked is not None and s > tracked]
    if above:
        raise CheckpointError(f"{root / TRACKER_FILE} says step {tracked}, but {_names(above)} above it were "
                              f"committed ({STEP_MARKER}); resuming from step {tracked} would train them "
                              "again and overwrite them. To continue from the newest, write its step into "
                              f"the tracker (echo {_step_of(above[0])} > {root / TRACKER_FILE}); to go back "
                              f"to step {tracked}, first move {_names(above)} out of {root}")
    steps = _step_dirs(root)
    if tracked is not None and steps and tracked not in {s for s, _ in steps}:
        logger.warning("%s names step %d, but %s does not exist; using older steps", root / TRACKER_FILE,
                       tracked, root / f"global_step_{tracked}")
    for step, path in steps:
        if tracked is not None and step > tracked:
            continue  # never committed (no marker there, as checked above)
        problem = step_dir_problem(path)
        if problem is None:
            yield str(path)
        else:
            logger.warning("skipping checkpoint %s: %s", path, problem)


def resume_candidates(resume_mode: str, default_local_dir: str | Path,
                      resume_from_path: str | Path | None = None) -> Iterator[str]:
    """The checkpoints to try, in order, under verl's `trainer.resume_mode`: auto, every committed step newest
    first (so a loader can fall back); resume_path, the given one; disable, none."""
    if resume_mode == "disable":
        return iter(())
    if resume_mode == "auto":
        return auto_candidates(Path(default_local_dir))
    if resume_mode == "resume_path":
        if not resume_from_path or _step_of(Path(resume_from_path)) is None:
            raise CheckpointError("trainer.resume_mode=resume_path needs trainer.resume_from_path pointing "
                                  f"at a global_step_N directory, got {resume_from_path!r}")
        problem = step_dir_problem(resume_from_path)
        if problem is not None:
            latest = next(auto_candidates(Path(resume_from_path).parent), None)
            hint = f"; the newest complete checkpoint there is {latest}" if latest else ""
            raise CheckpointError(f"trainer.resume_from_path: {problem}{hint}")
        return iter([str(resume_from_path)])
    raise ValueError(f"trainer.resume_mode must be 'disable', 'auto' or 'resume_path', got {resume_mode!r}")


def find_latest_ckpt_path(default_local_dir: str | Path) -> str | None:
    """The newest complete `global_step_N` at or below the tracker, or None (what `resume_mode=auto` takes)."""
    return next(auto_candidates(Path(default_local_dir)), None)


def resolve_resume_path(resume_mode: str, default_local_dir: str | Path,
                        resume_from_path: str | Path | None = None) -> str | None:
    """The checkpoint to resume from under verl's `trainer.resume_mode` (disable / auto / resume_path)."""
    return next(resume_candidates(resume_mode, default_local_dir, resume_from_path), None)


def quarantine_step(step_dir: str | Path) -> Path:
    """Rename `global_step_N` to `global_step_N.unloadable` (numbered if taken): kept, but no longer a step."""
    step_dir = Path(step_dir)
    target, n = step_dir.with_name(step_dir.name + UNLOADABLE_TAG), 1
    while target.exists():
        target, n = step_dir.with_name(f"{step_dir.name}{UNLOADABLE_TAG}-{n}"), n + 1
    os.rename(step_dir, target)
    _fsync_dir(step_dir.parent)
    return target


def _short(err: BaseException) -> str:
    # an error raised in a Ray worker arrives wrapped with the remote traceback; its cause says it all
    cause = getattr(err, "cause", None)
    return str(cause if isinstance(cause, BaseException) else err)


def load_newest_loadable(candidates: Iterable[str], load: Callable[[Path], Any],
                         fallback: bool = True) -> Path | None:
    """Call `load(path)` on each candidate until one loads; returns it (None when there are none). With
    `fallback` a CheckpointError warns and the next is tried; those that failed are then moved aside
    (`quarantine_step`), and if none loads the error lists every path and nothing moves."""
    failed: list[tuple[Path, str]] = []
    for candidate in candidates:
        path = Path(candidate)
        try:
            load(path)
        except CheckpointError as err:
            if not fallback:
                raise CheckpointError(f"could not load the checkpoint {path}: {_short(err)}") from err
            logger.warning("could not load the checkpoint %s; trying the previous committed step. %s",
                           path, _short(err))
            failed.append((path, _short(err)))
            continue
        for broken, _ in failed:
            moved = quarantine_step(broken)
            logger.warning("moved the checkpoint that failed to load, %s, to %s (kept: nothing is deleted); "
                           "resumed from %s", broken, moved, path)
        return path
    if failed:
        causes = "; ".join(f"{p}: {e}" for p, e in failed)
        raise CheckpointError(f"no checkpoint could be loaded: {causes}. Repair or move them away, or start "
                              "afresh in another trainer.default_local_dir")
    return None


def check_no_committed_after(default_local_dir: str | Path, step: int) -> None:
    """Raise CheckpointError if steps after `step` (where the run starts) were committed: it would overwrite them."""
    root = Path(default_local_dir)
    newer = [p for s, p in _marked_steps(root) if s > step]
    if newer:
        start = f"resumes from step {step}" if step else "starts from scratch"
        raise CheckpointError(f"{root} (trainer.default_local_dir) holds committed checkpoints "
                              f"{_names(newer)}, but this run {start}, so its saves would overwrite them. "
                              "Resume from the newest (trainer.resume_mode=auto), choose another "
                              f"trainer.default_local_dir, or move {_names(newer)} out of {root}")


def check_uncommitted(step_dir: str | Path) -> None:
    """Raise CheckpointError if `global_step_N` is committed: a save never overwrites a committed step."""
    step_dir = Path(step_dir)
    if (step_dir / STEP_MARKER).is_file():
        raise CheckpointError(f"{step_dir} is a committed checkpoint and a save never overwrites one; move "
                              "it away or choose another trainer.default_local_dir")
