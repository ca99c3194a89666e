"""The single controller: register worker methods, start worker groups (Ray only for its backend), dispatch."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hybridrl.controller.decorator import (
    DataProtoFuture,
    Dispatch,
    Execute,
    MethodSpec,
    register,
    register_dispatch_mode,
    registered_methods,
)
from hybridrl.controller.worker import HybridWorker, Worker
from hybridrl.controller.worker_group import (
    ClassWithInitArgs,
    LocalWorkerGroup,
    TypedWorkerGroup,
    WorkerGroup,
    hybrid_worker,
)
from hybridrl.utils.device import resolve_device_type

__all__ = [
    "ClassWithInitArgs",
    "DataProtoFuture",
    "Dispatch",
    "Execute",
    "HybridWorker",
    "LocalWorkerGroup",
    "MethodSpec",
    "TypedWorkerGroup",
    "Worker",
    "WorkerGroup",
    "create_worker_group",
    "hybrid_worker",
    "ray_for_backend",
    "register",
    "register_dispatch_mode",
    "registered_methods",
    "sigterm_raises_exit",
]


def create_worker_group(backend: str, cls_with_init: ClassWithInitArgs, resource_pool=None,
                        device: str | None = None) -> WorkerGroup:
    """Start a worker group on the chosen backend: "ray" (needs a resource pool; its ranks compute on cuda
    exactly when the pool reserves GPUs) or "local" (`device`: `trainer.device`; None: this process's)."""
    if backend == "local":
        return LocalWorkerGroup(cls_with_init, device=device)
    if backend == "ray":
        from hybridrl.controller.ray import RayWorkerGroup

        if resource_pool is None:
            raise ValueError("the ray backend needs a RayResourcePool to place the ranks")
        if device is not None and (resolve_device_type(device) == "cuda") != resource_pool.use_gpu:
            raise ValueError(f"device={device!r} but the resource pool has use_gpu={resource_pool.use_gpu}: "
                             f"build the pool with use_gpu=(trainer.device == 'cuda')")
        return RayWorkerGroup(resource_pool, cls_with_init)
    raise ValueError(f"unknown backend {backend!r}; use trainer.backend=ray or trainer.backend=local")


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # the exit status a shell reports for a process killed by signum


@contextmanager
def sigterm_raises_exit() -> Iterator[None]:
    """Inside the block, SIGTERM raises SystemExit(143) in the main thread, so `finally` cleanup runs (SIGTERM's
    default skips it); a program's own handler is kept, and off the main thread nothing changes."""
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
    """Start (or join, `init_kwargs` as `hybridrl.controller.ray.init_ray` takes them) Ray for a `ray` backend
    run, and shut it down afterwards if this call started it; other backends do not import Ray."""
    if backend != "ray":
        yield
        return
    import ray

    from hybridrl.controller.ray import init_ray

    started = not ray.is_initialized()
    try:
        init_ray(**init_kwargs)  # inside: a start that fails half-way is shut down too
        yield
    finally:
        if started:
            ray.shutdown()
