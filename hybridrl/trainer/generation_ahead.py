"""One step off the policy (`async_training.mode=one_step_off`): the rollout pool generates and scores the next
step's batch in a background thread while the training pool trains on this one (docs/placement.md).

The driver's main thread keeps every call on the training pool; the background thread calls only the rollout
pool, a reward model's own pool and the rule-based reward, so no worker ever sees two callers. The trainer
takes the finished batch at the next step's start, moves the weights of the update just made to the rollout
(a pool is never in two calls at once: generation has finished) and starts the step after.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from hybridrl.protocol import DataProto


@dataclass
class Collected:
    """A batch generated and scored for `step`, with what its generation measured: its metrics, its stage
    times and the workers' FLOPs and seconds per model pass (merged into the step that trains on it)."""

    step: int
    batch: DataProto
    metrics: dict[str, float] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    flops: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class Taken:
    """A collected batch as the training step receives it, with how long the trainer waited for it and how long
    the rollout side sat idle between its previous batch and this one."""

    collected: Collected
    trainer_idle_s: float
    rollout_idle_s: float


class GenerationAhead:
    """At most one batch in flight: `start(step)` collects it in the background, `take()` waits for it."""

    def __init__(self, collect: Callable[[int], Collected]) -> None:
        self._collect = collect
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generation-ahead")
        self._pending: Future[Collected] | None = None
        self._step: int | None = None
        self._finished_at: float | None = None
        self._rollout_idle_s = 0.0

    def holds(self, step: int) -> bool:
        """Whether the batch of `step` is in flight or done and not yet taken."""
        return self._pending is not None and self._step == step

    @property
    def in_flight(self) -> int:
        """Batches started and not taken (0 or 1): the queue between the two pools."""
        return int(self._pending is not None)

    def start(self, step: int) -> None:
        if self._pending is not None:
            raise RuntimeError(f"the batch of step {self._step} is still in flight; take it before starting step {step}")
        if self._finished_at is not None:
            self._rollout_idle_s += time.perf_counter() - self._finished_at
            self._finished_at = None
        self._step = step
        self._pending = self._executor.submit(self._run, step)

    def _run(self, step: int) -> Collected:
        try:
            return self._collect(step)
        finally:
            self._finished_at = time.perf_counter()

    def take(self) -> Taken:
        """The batch in flight, once finished (its generation's error is raised here)."""
        if self._pending is None:
            raise RuntimeError("no batch is in flight: start one first")
        start = time.perf_counter()
        try:
            collected = self._pending.result()
        finally:
            self._pending, self._step = None, None
        idle, self._rollout_idle_s = self._rollout_idle_s, 0.0
        return Taken(collected, time.perf_counter() - start, idle)

    def settle(self) -> Collected | None:
        """Wait until the batch in flight (if any) is finished, and return it without taking it: before the
        rollout pool validates or receives weights, and before a checkpoint saves it."""
        return None if self._pending is None else self._pending.result()

    def restore(self, collected: Collected) -> None:
        """Hold a batch generated before a checkpoint, as if it had just finished."""
        done: Future[Collected] = Future()
        done.set_result(collected)
        self._pending, self._step = done, collected.step
        self._finished_at = time.perf_counter()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
