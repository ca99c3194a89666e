"""WorkerGroup: the driver-side handle on N ranks of one worker class (`wg.call(Worker.method, *args)`), the
typed handles over it, and `LocalWorkerGroup`, the backend that runs one rank in the driver process."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch.distributed as dist

from hybridrl.controller.decorator import (
    DataProtoFuture,
    Execute,
    MethodSpec,
    get_dispatch_mode,
    registered_methods,
    resolve,
)
from hybridrl.controller.worker import HybridWorker, Worker
from hybridrl.utils.cpu_threads import restore_given_threads
from hybridrl.utils.device import DEVICE_ENV, ProcessMemory, device_env, resolve_device_type, restore_env
from hybridrl.utils.metric import ModelPass


@dataclass
class ClassWithInitArgs:
    """A worker class and the arguments to construct it with, on whichever process runs the rank."""

    cls: type
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        self.cls, self.args, self.kwargs = cls, args, kwargs

    def build(self) -> Any:
        return self.cls(*self.args, **self.kwargs)


class WorkerGroup:
    """Base class: dispatch and collection; subclasses start and address the ranks. `roles`: the role classes of
    a `HybridWorker` group, by name (none for any other worker class)."""

    def __init__(self, worker_cls: type, world_size: int, roles: Mapping[str, type] | None = None) -> None:
        self.worker_cls = worker_cls
        self.world_size = world_size
        self.roles = dict(roles or {})
        # read once: every call looks its method up here, and a class's registered methods never change
        self._specs = {None: registered_methods(worker_cls),
                       **{role: registered_methods(cls) for role, cls in self.roles.items()}}

    # ----- backend hooks -------------------------------------------------------------------------------
    def _submit(self, rank: int, role: str | None, method_name: str, args: tuple, kwargs: dict) -> Any:
        """Start `method_name` (of `role`, or of the worker) on `rank`: a future (Ray) or the value (local)."""
        raise NotImplementedError

    def shutdown(self) -> None:
        """Stop the ranks and release what starting them took."""
        raise NotImplementedError

    # ----- calls ---------------------------------------------------------------------------------------
    def method_specs(self, role: str | None = None) -> dict[str, MethodSpec]:
        """The registered methods of the worker class (or of role `role`'s class), by name."""
        if role not in self._specs:
            raise KeyError(f"this group of {self.worker_cls.__name__} has no role {role!r}; it has {sorted(self.roles)}")
        return self._specs[role]

    def call(self, method: str | Callable, /, *args: Any, **kwargs: Any) -> Any:
        """Dispatch, execute and collect a registered method of the worker class (`SFTWorker.train_batch`, or its name)."""
        return self.call_role(None, method, *args, **kwargs)

    def call_role(self, role: str | None, method: str | Callable, /, *args: Any, **kwargs: Any) -> Any:
        """As `call`, for a registered method of role `role` of a `HybridWorker` group (None: the worker's own)."""
        name = method if isinstance(method, str) else method.__name__
        specs = self.method_specs(role)
        if name not in specs:
            owner = self.worker_cls.__name__ if role is None else f"role {role!r} ({self.roles[role].__name__})"
            raise AttributeError(f"{owner} has no registered method {name!r}; it has {sorted(specs)}")
        spec = specs[name]
        mode = get_dispatch_mode(spec.dispatch_mode)
        per_rank_args, per_rank_kwargs = mode.dispatch_fn(self, *args, **kwargs)
        ranks = [0] if spec.execute_mode is Execute.RANK_ZERO else range(self.world_size)
        futures = [self._submit(rank, role, name, tuple(a[rank] for a in per_rank_args),
                                {k: v[rank] for k, v in per_rank_kwargs.items()})
                   for rank in ranks]
        if spec.execute_mode is Execute.RANK_ZERO:
            return self.results(futures, name)[0] if spec.blocking else futures[0]
        if not spec.blocking:
            return DataProtoFuture(futures) if mode.concatenates_protos else futures
        return mode.collect_fn(self, self.results(futures, name))

    def results(self, futures: list, method: str | None = None) -> list:
        """The values, in order, of the futures this group's calls of `method` returned."""
        return resolve(futures)


def hybrid_worker(roles: Mapping[str, ClassWithInitArgs]) -> ClassWithInitArgs:
    """The `HybridWorker` holding `roles` (role name -> worker class and arguments), to start as one group."""
    return ClassWithInitArgs(HybridWorker, roles=dict(roles))


def roles_of(cls_with_init: ClassWithInitArgs) -> dict[str, type]:
    """The role classes of a `HybridWorker` to be started, by role; empty for any other worker class."""
    if not issubclass(cls_with_init.cls, HybridWorker):
        return {}
    return {role: spec.cls for role, spec in cls_with_init.kwargs["roles"].items()}


class TypedWorkerGroup:
    """Base of the typed handles: holds the group and the methods every `Worker` has. A handle declares each
    worker method with its signature, as `return self._call(CriticWorker.compute_values, data)`."""

    worker_cls: ClassVar[type[Worker]]

    def __init__(self, group: WorkerGroup, role: str | None = None) -> None:
        have = group.method_specs(role)
        want = registered_methods(self.worker_cls)
        missing = sorted(set(want) - set(have))
        differ = sorted(name for name in set(want) & set(have) if want[name] != have[name])
        if missing or differ:
            of = group.worker_cls.__name__ if role is None else f"role {role!r} of {group.worker_cls.__name__}"
            raise TypeError(f"{type(self).__name__} drives {self.worker_cls.__name__}, but this group ({of}) "
                            f"lacks {missing} and registers {differ} differently")
        self.group, self.role = group, role

    def _call(self, method: Callable, /, *args: Any, **kwargs: Any) -> Any:
        """Run one of the worker's registered methods on every rank (of this handle's role)."""
        return self.group.call_role(self.role, method, *args, **kwargs)

    @property
    def world_size(self) -> int:
        return self.group.world_size

    def process_info(self) -> list[dict]:
        """Each rank's pid, host, rank and thread count."""
        return self._call(Worker.process_info)

    def process_memory(self) -> list[ProcessMemory]:
        """Each rank's process's peak memory."""
        return self._call(Worker.process_memory)

    def model_passes(self) -> list[dict[str, ModelPass]]:
        """Each rank's model passes, by name, for MFU (the role's worker class says which it runs)."""
        return self._call(Worker.model_passes)


DIST_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class LocalWorkerGroup(WorkerGroup):
    """The local backend: one rank, built and run in the driver process, whose torch.distributed environment
    and process group `shutdown` puts back. device: `trainer.device`; None keeps this process's own."""

    def __init__(self, cls_with_init: ClassWithInitArgs, device: str | None = None) -> None:
        self._saved_env: dict[str, str | None] | None = {key: os.environ.get(key)
                                                          for key in (*DIST_ENV_KEYS, DEVICE_ENV)}
        # a group nested inside another (same process group) must leave the outer one's group open
        self._owns_process_group = not dist.is_initialized()
        try:
            # a driver already in a process group keeps its coordinates; port 0: the OS's choice (worker.rank_store)
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "0")
            for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}.items():
                if os.environ.setdefault(key, value) != value:
                    raise RuntimeError(
                        f"the local backend runs one rank in this process, but {key}={os.environ[key]} is set; "
                        f"unset it or use trainer.backend=ray"
                    )
            if device is not None:
                os.environ.update(device_env(resolve_device_type(device)))
            self.worker = cls_with_init.build()
        except BaseException:
            self.shutdown()
            raise
        super().__init__(cls_with_init.cls, world_size=1, roles=roles_of(cls_with_init))

    def _submit(self, rank: int, role: str | None, method_name: str, args: tuple, kwargs: dict) -> Any:
        if role is None:
            return getattr(self.worker, method_name)(*args, **kwargs)
        return self.worker.execute_role(role, method_name, *args, **kwargs)

    def shutdown(self) -> None:
        """Drop the rank and put back the process group, environment and torch threads (once, however often called)."""
        self.worker = None
        if self._saved_env is None:
            return
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        restore_given_threads()
        restore_env(self._saved_env)
        self._saved_env = None
