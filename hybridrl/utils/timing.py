"""Wall-clock timing of the trainer's stages, in verl's `marked_timer` convention.

The fit loop wraps each stage in `with timer("gen", timing_raw): ...`; the seconds accumulate under that
name in the step's `timing_raw` dict, which `compute_timing_metrics` turns into `timing_s/<stage>` and
`timing_per_token_ms/<stage>`. verl's stage names are `step`, `gen`, `reward`, `old_log_prob`, `ref`,
`values`, `adv`, `update_critic`, `update_actor`, `testing` and `save_checkpoint`; `step` spans the
whole iteration and is what `compute_throughput_metrics` divides by.

A worker times its own share of a stage too (`report_worker_seconds`); the trainer files the slowest
rank's time as `<stage>_worker` (`worker_stage`), so `timing_s/gen` and `timing_s/gen_worker` sit side by
side and their difference is what dispatch, transfer and collection cost.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["WORKER_SECONDS", "marked_timer", "pop_worker_seconds", "report_worker_seconds", "timer",
           "worker_stage"]

# The key under meta_info["metrics"] that carries a rank's own seconds for one call. Inside `metrics`
# because concatenating the ranks' outputs gathers metrics into one list per key (rank order), where
# any other meta_info key must be equal on every rank.
WORKER_SECONDS = "worker_seconds"


@contextmanager
def timer(name: str, timing_raw: MutableMapping[str, float]) -> Iterator[None]:
    """Add the seconds spent in the `with` body to `timing_raw[name]` (created at 0.0 if absent).

    Accumulating rather than overwriting matters when a stage runs several times in one step (DAPO's
    dynamic sampling generates until the batch is full). The time is recorded even when the body raises,
    so a crash report still shows how long the failing stage ran.
    """
    start = time.perf_counter()  # monotonic: immune to wall-clock adjustments during long runs
    try:
        # a named range in a torch.profiler trace (benchmarks/profile_step.py); next to nothing otherwise
        with torch.profiler.record_function(name):
            yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + (time.perf_counter() - start)


@contextmanager
def marked_timer(
    name: str, timing_raw: MutableMapping[str, float], color: str | None = None
) -> Iterator[None]:
    """verl's signature (`color` names an NVTX range colour there); here it is the same as `timer`.

    There are no NVTX profiler ranges on CPU, so `color` is accepted and ignored to keep verl call sites
    working unchanged.
    """
    del color
    with timer(name, timing_raw):
        yield


def worker_stage(stage: str) -> str:
    """The timing name of a stage's time on the workers: `gen` -> `gen_worker` (`timing_s/gen_worker`)."""
    return f"{stage}_worker"


def report_worker_seconds(method: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a worker method returning a DataProto: its wall time goes into the output's metrics.

    Apply it below `@register`, so the time covers the method's own work and not the fetching of its
    input shards.
    """

    @functools.wraps(method)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        output = method(*args, **kwargs)
        output.meta_info.setdefault("metrics", {})[WORKER_SECONDS] = [time.perf_counter() - start]
        return output

    return timed


def pop_worker_seconds(meta_info: MutableMapping[str, Any]) -> float | None:
    """Take the ranks' seconds out of a collected output's metrics; the slowest rank's, or None if absent.

    The maximum is the honest wall time: ranks meet in collectives, so the call ends with the slowest.
    Drops `metrics` when nothing else is left in it.
    """
    metrics = meta_info.get("metrics")
    if not metrics or WORKER_SECONDS not in metrics:
        return None
    seconds = metrics.pop(WORKER_SECONDS)
    if not metrics:
        del meta_info["metrics"]
    return float(max(seconds)) if isinstance(seconds, (list, tuple)) else float(seconds)
