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
from hybridrl.utils.device import resolve_device_type

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


def create_worker_group(backend: str, cls_with_init: ClassWithInitArgs, resource_pool=None,
                        device: str | None = None) -> WorkerGroup:
    """Start a worker group on the chosen backend: "ray" (needs a resource pool) or "local".

    device: the local rank's device type (`trainer.device`; None keeps this process's). A Ray group's
    ranks compute on cuda exactly when its pool reserves GPU bundles (`use_gpu`).
    """
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
