"""Ending a run cleanly: Ray stopped by the driver that started it, also on an error or SIGTERM.

Python's default reaction to SIGTERM ends the process at once, skipping `finally` blocks and atexit
hooks. `sigterm_raises_exit` turns SIGTERM into SystemExit for the duration of a run, so the run's
cleanup (loggers flushed, workers and the local process group closed) runs as on any other exit.
`ray.init` installs the same conversion in a Ray driver (SystemExit(15)), so a terminated Ray driver's
`finally` blocks run as well and `ray_for_backend` shuts down the cluster it started: measured, its
processes (GCS, raylet, dashboard and runtime-env agents, workers) were gone when the driver exited.
A SIGKILLed driver runs nothing; its local cluster then lingers until Ray's own health checks stop
it (about a minute, measured).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # the exit status a shell reports for a process killed by signum


@contextmanager
def sigterm_raises_exit() -> Iterator[None]:
    """Inside the block, SIGTERM raises SystemExit(143) in the main thread; outside, nothing changes.

    Only replaces the default action: a program that installed its own SIGTERM handler keeps it, and
    off the main thread (where Python cannot install handlers) the block runs unchanged.
    """
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        yield
    finally:
        # ray.init replaces the handler with its own; that one belongs to Ray while it stays connected
        if signal.getsignal(signal.SIGTERM) is _exit_on_signal:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def ray_for_backend(backend: str, **init_kwargs: Any) -> Iterator[None]:
    """Start (or join) Ray for a `ray` backend run, and shut it down afterwards if this call started it.

    `init_kwargs` go to `hybridrl.controller.ray_resources.init_ray`. A driver that was already
    connected (a notebook, a test, a caller running several jobs) stays connected. Any other backend
    does not import Ray at all.
    """
    if backend != "ray":
        yield
        return
    import ray

    from hybridrl.controller.ray_resources import init_ray

    started = not ray.is_initialized()
    try:
        init_ray(**init_kwargs)  # inside: a start that fails half-way is shut down too
        yield
    finally:
        if started:
            ray.shutdown()
