"""Wall-clock timing of the trainer's stages, in verl's `marked_timer` convention.

The fit loop wraps each stage in `with timer("gen", timing_raw): ...`; the seconds accumulate under that
name in the step's `timing_raw` dict, which `compute_timing_metrics` turns into `timing_s/<stage>` and
`timing_per_token_ms/<stage>`. verl's stage names are `step`, `gen`, `reward`, `old_log_prob`, `ref`,
`values`, `adv`, `update_critic`, `update_actor`, `testing` and `save_checkpoint`; `step` spans the
whole iteration and is what `compute_throughput_metrics` divides by.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager

__all__ = ["marked_timer", "timer"]


@contextmanager
def timer(name: str, timing_raw: MutableMapping[str, float]) -> Iterator[None]:
    """Add the seconds spent in the `with` body to `timing_raw[name]` (created at 0.0 if absent).

    Accumulating rather than overwriting matters when a stage runs several times in one step (DAPO's
    dynamic sampling generates until the batch is full). The time is recorded even when the body raises,
    so a crash report still shows how long the failing stage ran.
    """
    start = time.perf_counter()  # monotonic: immune to wall-clock adjustments during long runs
    try:
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
