"""The single controller's machinery: register worker methods, start worker groups, dispatch calls.

Import the Ray backend from `hybridrl.controller.ray`; it is not imported here so that the local
backend and the decorators work without starting (or even importing) Ray.
"""

from hybridrl.controller.decorator import (
    Dispatch,
    Execute,
    MethodSpec,
    register,
    register_dispatch_mode,
    registered_methods,
)
from hybridrl.controller.futures import DataProtoFuture
from hybridrl.controller.local import LocalWorkerGroup
from hybridrl.controller.typed_group import TypedWorkerGroup
from hybridrl.controller.worker import Worker
from hybridrl.controller.worker_group import ClassWithInitArgs, WorkerGroup, create_colocated_worker_cls

__all__ = [
    "ClassWithInitArgs",
    "DataProtoFuture",
    "Dispatch",
    "Execute",
    "LocalWorkerGroup",
    "MethodSpec",
    "TypedWorkerGroup",
    "Worker",
    "WorkerGroup",
    "create_colocated_worker_cls",
    "create_worker_group",
    "register",
    "register_dispatch_mode",
    "registered_methods",
]


def create_worker_group(backend: str, cls_with_init: ClassWithInitArgs, resource_pool=None) -> WorkerGroup:
    """Start a worker group on the chosen backend: "ray" (needs a resource pool) or "local"."""
    if backend == "local":
        return LocalWorkerGroup(cls_with_init)
    if backend == "ray":
        from hybridrl.controller.ray import RayWorkerGroup

        if resource_pool is None:
            raise ValueError("the ray backend needs a RayResourcePool to place the ranks")
        return RayWorkerGroup(resource_pool, cls_with_init)
    raise ValueError(f"unknown backend {backend!r}; use trainer.backend=ray or trainer.backend=local")
