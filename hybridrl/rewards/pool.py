"""Where a reward manager's calls run: a persistent process pool with a per-call timeout that survives the
function's crashes (`RewardPool`), or this process (`InProcessRunner`); `make_runner` picks by config."""

from __future__ import annotations

import contextlib
import enum
import faulthandler
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import hybridrl
from hybridrl.rewards.failures import COUNTED_FAILURES, Outcome, RewardFailureError, Status, call_guarded

# loading the function may import sympy or math-verify; a worker not ready by then is broken
STARTUP_TIMEOUT_S = 120.0
# the longest a hung worker gets to write its stack dump before it is killed
STACK_DUMP_WAIT_S = 1.0


def accept_any(value: Any, kwargs: Mapping[str, Any]) -> Any:
    """The pool's default check: every return value is accepted as it is."""
    return value


# the worker's command: import this hybridrl, serve on the socket passed as a file descriptor
_BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); from hybridrl.rewards.pool import worker_main; "
         "worker_main(int(sys.argv[2]), sys.argv[3])")
_ROOT = str(Path(hybridrl.__file__).resolve().parents[1])


def worker_main(fd: int, fault_path: str) -> None:
    """A worker: load the function, report ready, then answer (index, kwargs) tasks until told to stop."""
    conn = Connection(fd)
    with open(fault_path, "w") as fault_file:
        faulthandler.enable(fault_file)  # a segfault leaves its stack here
        faulthandler.register(signal.SIGUSR1, fault_file, all_threads=True)  # the pool asks for a hung stack
        try:
            sys_path, payload = conn.recv()
            sys.path[:] = sys_path  # the driver's, which the function's module may need
            fn, check = pickle.loads(payload)
        except BaseException:
            conn.send(("broken", traceback.format_exc()))
            return
        conn.send(("ready", None))
        while True:
            try:
                task = conn.recv()
            except (EOFError, OSError):  # the driver is gone
                return
            if task is None:
                return
            index, kwargs = task
            outcome = call_guarded(fn, kwargs, check)
            try:
                data = pickle.dumps((index, outcome))
            except Exception as err:  # e.g. extras holding an open file or a lock
                data = pickle.dumps((index, Outcome(
                    Status.WRONG_TYPE, error=f"the returned value cannot be sent from the worker process "
                                             f"({type(err).__name__}: {err})")))
            conn.send_bytes(data)


class WorkerState(enum.Enum):
    STARTING = "starting"  # started, has not yet reported that it loaded the function
    IDLE = "idle"
    BUSY = "busy"  # running one call, since `started`


class _Worker:
    def __init__(self, sys_path: list[str], payload: bytes, fault_path: str) -> None:
        parent, child = socket.socketpair()
        self.fault_path = fault_path
        with child:
            # its own session: Ctrl-C reaches the driver only, and killpg ends what the function started
            self.proc = subprocess.Popen([sys.executable, "-c", _BOOT, _ROOT, str(child.fileno()), fault_path],
                                         pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.conn = Connection(parent.detach())
        self.conn.send((sys_path, payload))
        # readable when the process exits, so waits wake at once on a crash
        try:
            self.pidfd: int | None = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):  # not Linux >= 5.3: waits poll instead
            self.pidfd = None
        self.state = WorkerState.STARTING
        self.task: int | None = None
        self.started = time.monotonic()

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def assign(self, index: int, kwargs: Mapping[str, Any]) -> None:
        self.conn.send((index, kwargs))
        self.state, self.task, self.started = WorkerState.BUSY, index, time.monotonic()

    def stack_dump(self) -> str | None:
        """What faulthandler wrote: the stack of a fatal signal, or of a hung call after `request_stack`."""
        try:
            text = Path(self.fault_path).read_text(errors="replace").strip()
        except OSError:
            return None
        return text or None

    def request_stack(self) -> None:
        """Ask faulthandler for the hung stack; wait until the dump stops growing."""
        if not self.is_alive():
            return
        os.kill(self.proc.pid, signal.SIGUSR1)
        deadline, size = time.monotonic() + STACK_DUMP_WAIT_S, -1
        while time.monotonic() < deadline:
            time.sleep(0.01)
            now = os.path.getsize(self.fault_path) if os.path.exists(self.fault_path) else 0
            if 0 < now == size:
                return
            size = now

    def kill(self) -> None:
        """Kill the worker's process group (the code sandbox's own session is left to its limits)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.conn.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        Path(self.fault_path).unlink(missing_ok=True)

    def stop(self) -> None:
        """Ask an idle worker to exit; kill one that is busy or does not exit within a second."""
        if self.state is WorkerState.IDLE and self.is_alive():
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self.conn.send(None)
                self.proc.wait(timeout=1.0)
        self.kill()


def _stop_all(workers: list[_Worker | None], fault_dir: str) -> None:
    for w in workers:
        if w is not None:
            w.stop()
    workers.clear()
    shutil.rmtree(fault_dir, ignore_errors=True)


class RewardPool:
    """`num_workers` persistent processes that call the pickled `fn(**kwargs)`, `check(value, kwargs)` on the
    result, with a per-call `timeout` in seconds: a call past it is killed (after a stack dump), a dead worker
    replaced, each with an `Outcome` saying so. Workers are fresh interpreters: a fork would copy the
    driver's model and maybe a held lock, a spawn re-run an unguarded `__main__`."""

    def __init__(self, fn: Callable[..., Any], num_workers: int, timeout: float,
                 check: Callable[[Any, Mapping[str, Any]], Any] = accept_any) -> None:
        if num_workers <= 0 or timeout <= 0:
            raise ValueError(f"num_workers and timeout must be positive, got {num_workers} and {timeout}")
        try:
            self._payload = pickle.dumps((fn, check))
        except Exception as err:
            raise ValueError(f"the reward function {fn!r} cannot be sent to a worker process "
                             f"({type(err).__name__}: {err}). Define it at module level in a file "
                             "(custom_reward_function.path/name), or run it in the driver with "
                             "reward_model.reward_fn_workers=0 (no timeout, no crash isolation)") from err
        self.num_workers, self.timeout = num_workers, timeout
        self._fault_dir = tempfile.mkdtemp(prefix="hybridrl-reward-pool-")
        self._workers: list[_Worker | None] = []
        self._started = 0
        # workers end with the pool even without close(), and with the driver (their pipe closes)
        self._finalizer = weakref.finalize(self, _stop_all, self._workers, self._fault_dir)

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._finalizer()

    def _restart(self, slot: int) -> None:
        """Kill the worker in `slot`, if any, and start a fresh one there."""
        if (old := self._workers[slot]) is not None:
            old.kill()
        self._started += 1
        fault_path = os.path.join(self._fault_dir, f"worker-{self._started}.txt")
        self._workers[slot] = _Worker(list(sys.path), self._payload, fault_path)

    def _fill(self, wanted: int) -> None:
        """Start workers until `wanted` slots hold a live one (dead idle workers are replaced too)."""
        if not self._finalizer.alive:
            raise RuntimeError("this RewardPool is closed")
        self._workers += [None] * (wanted - len(self._workers))
        for i in range(wanted):
            w = self._workers[i]
            if w is None or not w.is_alive():
                self._restart(i)

    def map(self, kwargs_list: Sequence[Mapping[str, Any]], max_failures: int | None = None) -> list[Outcome]:
        """One Outcome per kwargs, in input order. With `max_failures`, stops once more than that many have
        failed or one was fatal (the rest `skipped`), or once the first `stall_limit()` calls to end, from
        different prompts by `processing_order`, all timed out (the rest `stalled`)."""
        outcomes: list[Outcome | None] = [None] * len(kwargs_list)
        todo = deque(processing_order(len(kwargs_list)))
        self._fill(min(self.num_workers, len(kwargs_list)))
        stoppable = max_failures is not None and max_failures < len(kwargs_list)
        failures = ended = 0
        returned = False  # has any call of this batch ended other than by a timeout?
        while todo or any(w is not None and w.state is WorkerState.BUSY for w in self._workers):
            for slot, w in enumerate(self._workers):
                if w is not None and w.state is WorkerState.IDLE and todo:
                    index = todo.popleft()
                    try:
                        w.assign(index, kwargs_list[index])
                    except OSError:  # it died while idle (killed from outside): replace it, requeue the row
                        todo.appendleft(index)
                        self._restart(slot)
            for slot, w in enumerate(self._workers):
                if w is None or w.state is WorkerState.IDLE:
                    continue
                outcome = self._poll(w, slot)
                if outcome is None:
                    continue
                index, outcome = outcome
                outcomes[index] = outcome
                ended += 1
                returned = returned or outcome.status is not Status.TIMEOUT
                failures += outcome.status in COUNTED_FAILURES
                if outcome.status is Status.FATAL or (max_failures is not None and failures > max_failures):
                    self._abandon()
                    return [o or Outcome(Status.SKIPPED) for o in outcomes]
                if stoppable and not returned and ended >= self.stall_limit() and todo:
                    self._abandon()
                    return [o or Outcome(Status.STALLED) for o in outcomes]
            self._wait()
        return [o or Outcome(Status.SKIPPED) for o in outcomes]

    def stall_limit(self) -> int:
        """First calls of a batch that must all time out to stop it as hung: one per worker, at least two."""
        return max(2, self.num_workers)

    def _wait(self) -> None:
        """Sleep until a worker has something to say, dies, or reaches its deadline."""
        waiting = [w for w in self._workers if w is not None and w.state is not WorkerState.IDLE]
        if not waiting:
            return
        deadline = min(w.started + (self.timeout if w.state is WorkerState.BUSY else STARTUP_TIMEOUT_S)
                       for w in waiting)
        pidfds = [w.pidfd for w in waiting if w.pidfd is not None]
        timeout = max(0.0, deadline - time.monotonic())
        if len(pidfds) < len(waiting):
            timeout = min(timeout, 0.1)  # no exit descriptor: look at the processes ten times a second
        wait([w.conn for w in waiting] + pidfds, timeout=timeout)

    def _poll(self, w: _Worker, slot: int) -> tuple[int, Outcome] | None:
        """A finished call's (index, outcome), or None; starts idle workers and replaces hung or dead ones."""
        if w.state is WorkerState.STARTING:
            self._poll_start(w)
            return None
        index = w.task
        assert index is not None
        if w.conn.poll():
            try:
                data = w.conn.recv_bytes()
            except (EOFError, OSError):  # the socket closed: the worker is exiting, or the function closed it
                with contextlib.suppress(subprocess.TimeoutExpired):
                    w.proc.wait(timeout=5.0)
                if w.is_alive():  # nothing can come back from it: no wait for the call's timeout
                    self._restart(slot)
                    return index, Outcome(Status.CRASH, error="the worker closed its connection to the pool during "
                                                              "the call")
            else:
                w.state, w.task = WorkerState.IDLE, None
                return index, _loads_outcome(data)
        if not w.is_alive():
            outcome = Outcome(Status.CRASH, error=f"the worker process exited with {_exit_text(w.proc.returncode)} "
                                                  f"during the call", traceback=w.stack_dump())
        elif time.monotonic() - w.started >= self.timeout:
            w.request_stack()
            outcome = Outcome(Status.TIMEOUT, error=f"no result within {self.timeout:g} s",
                              traceback=w.stack_dump())
        else:
            return None
        self._restart(slot)
        return index, outcome

    def _poll_start(self, w: _Worker) -> None:
        if w.conn.poll():
            try:
                kind, detail = w.conn.recv()
            except (EOFError, OSError):
                kind, detail = "broken", f"the worker exited with {_exit_text(w.proc.poll())} while starting"
            if kind == "ready":
                w.state = WorkerState.IDLE
                return
        elif w.is_alive() and time.monotonic() - w.started < STARTUP_TIMEOUT_S:
            return
        else:
            detail = f"the worker did not start within {STARTUP_TIMEOUT_S:g} s (exit: {_exit_text(w.proc.poll())})"
        self.close()
        raise RewardFailureError(
            f"the reward function cannot be loaded in a worker process:\n{detail}\nFix the import (the file "
            f"and what it imports must load in a fresh process), or run it in the driver with "
            f"reward_model.reward_fn_workers=0 (no timeout, no crash isolation)"
        )

    def _abandon(self) -> None:
        """Kill the workers still running calls (a new worker takes each slot on the next map)."""
        for slot, w in enumerate(self._workers):
            if w is not None and w.state is WorkerState.BUSY:
                w.kill()
                self._workers[slot] = None


def processing_order(rows: int) -> list[int]:
    """Row indices in van der Corput order (0, n/2, n/4, 3n/4, ...): the first k lie about n/k apart, so
    they come from different GRPO groups, and one slow prompt cannot pass for a function that always hangs."""
    if rows <= 0:
        return []
    bits = (rows - 1).bit_length()
    reversed_j = (int(format(j, f"0{bits}b")[::-1], 2) if bits else 0 for j in range(1 << bits))
    # floor(rows * r / 2^bits) reaches every row over all j; keep each row's first appearance
    return list(dict.fromkeys(r * rows >> bits for r in reversed_j))


def _loads_outcome(data: bytes) -> Outcome:
    try:
        _, outcome = pickle.loads(data)
    except Exception as err:  # e.g. extras of a class the driver cannot import
        return Outcome(Status.WRONG_TYPE, error=f"the returned value cannot be read by the driver "
                                                f"({type(err).__name__}: {err})")
    return outcome


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def default_num_workers() -> int:
    """The CPUs this process may run on (its affinity, not the machine's count), at most 64."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(64, cpus))


class InProcessRunner:
    """Calls in this process, in order, stopping like `RewardPool.map` once the step has failed."""

    def __init__(self, fn: Callable[..., Any], check: Callable[[Any, Mapping[str, Any]], Any]) -> None:
        self.fn, self.check = fn, check

    def map(self, kwargs_list: Sequence[Mapping[str, Any]], max_failures: int | None = None) -> list[Outcome]:
        outcomes: list[Outcome] = []
        failures = 0
        for kwargs in kwargs_list:
            outcome = call_guarded(self.fn, kwargs, self.check)
            outcomes.append(outcome)
            failures += outcome.status in COUNTED_FAILURES
            if outcome.status is Status.FATAL or (max_failures is not None and failures > max_failures):
                break
        return outcomes + [Outcome(Status.SKIPPED)] * (len(kwargs_list) - len(outcomes))

    def close(self) -> None:
        pass


def make_runner(fn: Callable[..., Any], check: Callable[[Any, Mapping[str, Any]], Any], timeout: float,
                num_workers: int | None) -> RewardPool | InProcessRunner:
    """A pool of `num_workers` (None: `default_num_workers()`) processes, or the driver for 0: no timeout
    and no crash protection, but no pickling (a breakpoint in the function works)."""
    if num_workers is not None and num_workers < 0:
        raise ValueError(f"reward_model.reward_fn_workers must be >= 0 (0 runs the reward function in the "
                         f"driver), got {num_workers}")
    if not timeout > 0:
        raise ValueError(f"reward_model.reward_fn_timeout must be positive seconds, got {timeout}")
    if num_workers == 0:
        return InProcessRunner(fn, check)
    return RewardPool(fn, num_workers or default_num_workers(), timeout, check)
