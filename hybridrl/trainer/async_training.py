"""The asynchronous modes (`async_training.mode`): one step off (`GenerationAhead`) and streaming (`Streamer`),
as docs/placement.md describes them, with the staleness budget. Generation runs in a background thread that
calls only the rollout pool, a reward model's own pool and the rule-based reward, while the main thread keeps
every call on the training pool, so no worker ever sees two callers.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

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

# Tokens a rollout call decodes at most before it returns: bounds how long a weight sync or a checkpoint waits.
MAX_STEPS_PER_CALL = 32


@dataclass(frozen=True)
class StreamSettings:
    step_prompts: int  # prompts (groups) one training step takes
    sync_every: int  # async_training.trigger_parameter_sync_step
    staleness_threshold: float
    partial: bool  # async_training.partial_rollout
    n: int  # samples per prompt
    prompts_per_rank: int  # groups a rank decodes at once (rollout.max_num_seqs // n)

    @property
    def window(self) -> int:
        """Prompts the rollout may admit between two syncs (before what is carried over is subtracted)."""
        return math.ceil((1 + self.staleness_threshold) * self.sync_every * self.step_prompts)

    @property
    def max_staleness(self) -> int:
        """The most weight versions a trained sample may lag the weights it trains: a window's last samples wait
        `sync_every - 1` updates, and the threshold's share of a window carries over into the next ones."""
        return self.sync_every - 1 + math.ceil(self.staleness_threshold * self.sync_every)


@dataclass
class TakenGroups:
    """Finished groups as a streaming step receives them, with the idle times and the groups dropped."""

    batch: DataProto
    trainer_idle_s: float
    rollout_idle_s: float
    dropped: int  # groups dropped as staler than the bound


class Streamer:
    """The background thread, the queue of finished groups, and the sync handshake with the training step."""

    def __init__(self, generate: Callable[[list[DataProto | None], int, bool], list[DataProto | None]],
                 ranks: int, draw: Callable[[int], DataProto], settings: StreamSettings) -> None:
        self._generate, self._ranks, self._draw, self.settings = generate, ranks, draw, settings
        self._cond = threading.Condition()
        self._queue: deque[DataProto] = deque()
        self._in_flight = [0] * ranks
        self._budget = settings.window
        self._pause_wanted = False
        self._drain = False
        self._parked = False
        self._closing = False
        self._error: BaseException | None = None
        self._idle_s = 0.0
        self._thread: threading.Thread | None = None

    # ----- the main thread's side -------------------------------------------------------------------------
    def start(self, restored: DataProto | None = None) -> None:
        """Start the thread; `restored`: finished groups saved by a checkpoint, queued first."""
        if restored is not None and len(restored):
            self._queue.extend(restored.split(self.settings.n))  # a prompt's group: n consecutive rows
            self._budget -= len(self._queue)
        self._thread = threading.Thread(target=self._run, name="streaming-rollout", daemon=True)
        self._thread.start()

    @property
    def queue_size(self) -> int:
        return len(self._queue)

    def take(self, groups: int, version: int) -> TakenGroups:
        """The next `groups` finished groups (FIFO), once there; a group whose oldest token lags `version` by more
        than `settings.max_staleness` is dropped and the rollout may admit another prompt in its place. Raises what
        the thread raised."""
        start = time.perf_counter()
        taken, dropped = [], 0
        with self._cond:
            while len(taken) < groups:
                self._cond.wait_for(lambda: self._queue or self._error is not None or self._closing)
                self._raise_error()
                if self._closing:
                    raise RuntimeError("the streaming rollout was closed while a step waited for samples")
                group = self._queue.popleft()
                if int(staleness(group, version).max()) > self.settings.max_staleness:
                    dropped += 1
                    self._budget += 1  # its prompt's place in the window: a fresh one replaces it
                    self._cond.notify_all()
                else:
                    taken.append(group)
            idle, self._idle_s = self._idle_s, 0.0
            self._cond.notify_all()
        return TakenGroups(DataProto.concat(taken), time.perf_counter() - start, idle, dropped)

    @contextmanager
    def paused(self, drain: bool, new_window: bool = False) -> Iterator[None]:
        """Park the thread at a call boundary for the block (`drain`: once no row is in flight). `new_window`: a
        weight sync opens the next window of the staleness budget."""
        with self._cond:
            self._pause_wanted, self._drain = True, drain
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._parked or self._error is not None)
            self._raise_error()
        try:
            yield
        finally:
            with self._cond:
                if new_window:
                    self._budget = self.settings.window - len(self._queue) - sum(self._in_flight)
                self._pause_wanted = self._drain = False
                self._cond.notify_all()

    def queued(self) -> DataProto | None:
        """The finished groups not yet taken (while paused: for a checkpoint)."""
        with self._cond:
            return DataProto.concat(list(self._queue)) if self._queue else None

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError("the streaming rollout failed") from self._error

    # ----- the thread ---------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                prompts = self._next_prompts()
                if prompts is None:
                    return
                outputs = self._generate(prompts, MAX_STEPS_PER_CALL, self.settings.partial)
                finished = [(rank, out.split(self.settings.n)) for rank, out in enumerate(outputs) if out is not None]
                with self._cond:
                    for rank, groups in finished:
                        self._in_flight[rank] -= len(groups)
                        self._queue.extend(groups)
                    self._cond.notify_all()
        except BaseException as error:  # handed to the main thread at its next take or pause
            with self._cond:
                self._error = error
                self._cond.notify_all()

    def _next_prompts(self) -> list[DataProto | None] | None:
        """Wait until there is work (or a pause to honour), then each rank's new prompts; None when closing."""
        with self._cond:
            while True:
                if self._closing:
                    return None
                pausing = self._pause_wanted and not (self._drain and sum(self._in_flight))
                if pausing:
                    self._parked = True
                    self._cond.notify_all()
                    waited = time.perf_counter()
                    self._cond.wait_for(lambda: not self._pause_wanted or self._closing)
                    self._idle_s += time.perf_counter() - waited
                    self._parked = False
                    continue
                admit = 0 if self._pause_wanted else self._room()
                if admit or sum(self._in_flight):
                    break
                waited = time.perf_counter()
                self._cond.wait()  # the budget is spent: the next sync (or close) wakes the thread
                self._idle_s += time.perf_counter() - waited
            self._budget -= admit
        per_rank: list[DataProto | None] = [None] * self._ranks
        if admit:
            drawn = self._draw(admit)
            for i in range(admit):
                rank = min(range(self._ranks), key=lambda r: self._in_flight[r])
                self._in_flight[rank] += 1
                row = drawn.select_rows([i])
                per_rank[rank] = row if per_rank[rank] is None else DataProto.concat([per_rank[rank], row])
        return per_rank

    def _room(self) -> int:
        """New prompts to admit now: within the budget, and up to twice what the ranks decode at once (the rest
        wait in a rank's batch, so a finished row's place is taken at once)."""
        room = 2 * self.settings.prompts_per_rank * self._ranks - sum(self._in_flight)
        return max(0, min(self._budget, room))


def staleness(batch: DataProto, version: int) -> torch.Tensor:
    """Each row's lag in weight versions: `version` (the weights the step trains) minus its oldest token's."""
    return version - batch.batch["weight_version"]
