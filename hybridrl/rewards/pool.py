"""A process pool that scores samples with a per-sample timeout and survives hung or crashing scorers.

`concurrent.futures.ProcessPoolExecutor` cannot stop a task that never returns, and one worker dying
breaks the whole executor. Here each worker runs one sample at a time; a worker past its deadline is
killed and replaced, a worker that dies is replaced, and the sample gets an outcome saying so.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any


@dataclasses.dataclass
class Outcome:
    """Result of one sample: status is "ok", "timeout", "error" (the scorer raised) or "crash"."""

    status: str
    value: Any = None
    error: str | None = None


def _worker_loop(fn: Callable[..., Any], conn: Connection) -> None:
    while True:
        task = conn.recv()
        if task is None:
            return
        index, kwargs = task
        try:
            conn.send((index, Outcome("ok", fn(**kwargs))))
        except Exception as err:  # a scorer bug scores this sample 0; it must not stop the batch
            conn.send((index, Outcome("error", error=f"{type(err).__name__}: {err}")))


class _Worker:
    def __init__(self, ctx: Any, fn: Callable[..., Any]) -> None:
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_loop, args=(fn, child_conn), daemon=True)
        self.proc.start()
        child_conn.close()
        self.task: int | None = None
        self.started = 0.0

    def assign(self, index: int, kwargs: dict) -> None:
        self.task, self.started = index, time.monotonic()
        self.conn.send((index, kwargs))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()


def score_in_pool(
    fn: Callable[..., Any],
    kwargs_list: Sequence[dict],
    num_workers: int,
    timeout: float,
    start_method: str = "fork",
) -> list[Outcome]:
    """Call `fn(**kwargs)` for each entry on `num_workers` processes; results keep the input order.

    "fork" (default) lets `fn` be any callable, including one loaded from a user's file; the workers
    only score, they never touch torch.
    """
    if num_workers <= 0 or timeout <= 0:
        raise ValueError(f"num_workers and timeout must be positive, got {num_workers} and {timeout}")
    ctx = mp.get_context(start_method)
    outcomes: list[Outcome | None] = [None] * len(kwargs_list)
    todo = deque(range(len(kwargs_list)))
    workers = [_Worker(ctx, fn) for _ in range(min(num_workers, len(kwargs_list)))]
    try:
        while todo or any(w.task is not None for w in workers):
            for w in workers:
                if w.task is None and todo:
                    index = todo.popleft()
                    w.assign(index, kwargs_list[index])
            busy = [w for w in workers if w.task is not None]
            next_deadline = min(w.started + timeout for w in busy)
            ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy],
                         timeout=max(0.0, next_deadline - time.monotonic()))
            for i, w in enumerate(workers):
                if w.task is None:
                    continue
                outcome = _collect(w, ready, timeout)
                if outcome is None:
                    continue
                outcomes[w.task] = outcome
                w.task = None
                if outcome.status in ("timeout", "crash"):
                    w.kill()
                    workers[i] = _Worker(ctx, fn)
    finally:
        for w in workers:
            if w.proc.is_alive() and w.task is None:
                w.conn.send(None)
            w.proc.join(timeout=1.0)
            if w.proc.is_alive():
                w.kill()
    return [o if o is not None else Outcome("crash", error="lost") for o in outcomes]


def _collect(w: _Worker, ready: list, timeout: float) -> Outcome | None:
    """The finished sample's outcome, a timeout/crash outcome, or None while it is still running."""
    if w.conn in ready:
        try:
            _, outcome = w.conn.recv()
            return outcome
        except (EOFError, OSError):
            return Outcome("crash", error=f"worker {w.proc.pid} died")
    if w.proc.sentinel in ready:
        w.proc.join()
        return Outcome("crash", error=f"worker {w.proc.pid} exited with code {w.proc.exitcode}")
    if time.monotonic() - w.started >= timeout:
        return Outcome("timeout", error=f"no result within {timeout:g}s")
    return None


def default_num_workers() -> int:
    return max(1, min(64, os.cpu_count() or 1))
