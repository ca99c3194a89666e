"""WorkerGroup: the driver-side handle on N ranks of one worker class, and the typed handles over it.

`wg.call(Worker.method, *args)` dispatches the arguments of a `@register`-ed method, runs it on the
ranks and collects the results; it is the one way to call a worker method. Backends (Ray, local) only
say how to start ranks and how to run one method on one rank. The trainers reach a group through a
typed handle (`TypedWorkerGroup`): one explicit method per worker method, with the worker's signature,
which an editor and a type checker can follow from the trainer's call to the worker's code.

`LocalWorkerGroup` is the local backend: one rank in the driver process, no Ray.
"""

from __future__ import annotations

import copy
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
    register,
    registered_methods,
    resolve,
)
from hybridrl.controller.worker import Worker
from hybridrl.utils.device import DEVICE_ENV, ProcessMemory, device_env, resolve_device_type
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
    """Base class: method binding, dispatch and collection. Subclasses start and address the ranks."""

    def __init__(self, worker_cls: type, world_size: int) -> None:
        self.worker_cls = worker_cls
        self.world_size = world_size
        self.method_names: list[str] = []
        self._methods: dict[str, tuple[str, MethodSpec]] = {}  # name on this group -> (name on the ranks, spec)
        self._bind_methods(registered_methods(worker_cls))

    # ----- backend hooks -------------------------------------------------------------------------------
    def _submit(self, rank: int, method_name: str, args: tuple, kwargs: dict) -> Any:
        """Start `method_name` on `rank`; return a future (Ray) or the value (local)."""
        raise NotImplementedError

    def shutdown(self) -> None:
        """Stop the ranks and release what starting them took."""
        raise NotImplementedError

    # ----- binding -------------------------------------------------------------------------------------
    def _bind_methods(self, methods: Mapping[str, MethodSpec], prefix: str = "") -> None:
        for remote_name, spec in methods.items():
            if not remote_name.startswith(prefix):
                continue
            name = remote_name[len(prefix):]
            self._methods[name] = (remote_name, spec)
            self.method_names.append(name)

    def method_specs(self) -> dict[str, MethodSpec]:
        """The registered methods this group can call, by their name on the group."""
        return {name: spec for name, (_, spec) in self._methods.items()}

    def call(self, method: str | Callable, /, *args: Any, **kwargs: Any) -> Any:
        """Dispatch, execute and collect one registered method.

        `method` is the worker class's method itself (`CriticWorker.compute_values`, which a reader can
        jump to) or its name; on a role view made by `spawn` it is the role's method, without the prefix.
        """
        name = method if isinstance(method, str) else method.__name__
        if name not in self._methods:
            raise AttributeError(
                f"{self.worker_cls.__name__} has no registered method {name!r} on this group; "
                f"it has {sorted(self._methods)}"
            )
        remote_name, spec = self._methods[name]
        mode = get_dispatch_mode(spec.dispatch_mode)
        per_rank_args, per_rank_kwargs = mode.dispatch_fn(self, *args, **kwargs)
        ranks = [0] if spec.execute_mode is Execute.RANK_ZERO else range(self.world_size)
        futures = [
            self._submit(
                rank,
                remote_name,
                tuple(a[rank] for a in per_rank_args),
                {k: v[rank] for k, v in per_rank_kwargs.items()},
            )
            for rank in ranks
        ]
        if not spec.blocking:
            if spec.execute_mode is Execute.RANK_ZERO:
                return futures[0]
            return DataProtoFuture(futures) if mode.concatenates_protos else futures
        outputs = resolve(futures)
        if spec.execute_mode is Execute.RANK_ZERO:
            return outputs[0]
        return mode.collect_fn(self, outputs)

    # ----- colocation ----------------------------------------------------------------------------------
    def spawn(self, prefix_set) -> dict[str, WorkerGroup]:
        """One group per role of a colocated worker class: same processes, methods without the prefix."""
        views = {}
        for role in prefix_set:
            view = copy.copy(self)
            view.method_names, view._methods = [], {}
            view._bind_methods(registered_methods(self.worker_cls), prefix=f"{role}_")
            if not view.method_names:
                raise ValueError(f"role {role!r} has no registered methods in {self.worker_cls.__name__}")
            views[role] = view
        return views


def create_colocated_worker_cls(class_dict: Mapping[str, ClassWithInitArgs]) -> ClassWithInitArgs:
    """Fuse several roles into one worker class so they share a process per rank.

    The fused worker builds each role's worker inside its own process and exposes every registered
    method `m` of role `r` as `r_m`; `WorkerGroup.spawn(prefix_set=roles)` gives back one group per role.
    """
    roles = dict(class_dict)
    namespace: dict[str, Any] = {}
    for role, cls_with_init in roles.items():
        for name, spec in registered_methods(cls_with_init.cls).items():
            namespace[f"{role}_{name}"] = _role_forwarder(role, name, spec)

    def __init__(self) -> None:  # noqa: N807 - a method body for the generated class
        Worker.__init__(self)
        self.roles = {role: cwi.build() for role, cwi in roles.items()}

    namespace["__init__"] = __init__
    fused = type("Colocated_" + "_".join(roles), (Worker,), namespace)
    return ClassWithInitArgs(fused)


def _role_forwarder(role: str, name: str, spec: MethodSpec) -> Callable:
    # The role's own registered method materialises shards and trims padding, so the forwarder only
    # carries the spec for binding and passes the arguments through unopened.
    @register(spec.dispatch_mode, spec.execute_mode, spec.blocking, materialize_futures=False)
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.roles[role], name)(*args, **kwargs)

    forward.__name__ = f"{role}_{name}"
    return forward


class TypedWorkerGroup:
    """Base of the typed handles: holds the group and the methods every `Worker` has.

    A handle declares each worker method with the worker's signature and hands the call to the group
    together with the worker method itself, so jump-to-definition goes from a trainer's call to the
    handle's method and on to the worker's:

        class CriticGroup(TypedWorkerGroup):
            worker_cls = CriticWorker

            def compute_values(self, data: DataProto) -> DataProto:
                return self.group.call(CriticWorker.compute_values, data)

    The return type is what the dispatch mode collects: a DataProto for DP_COMPUTE_PROTO, a list with
    one entry per rank for ONE_TO_ALL; a handle returns None where every rank returns None.
    """

    worker_cls: ClassVar[type[Worker]]

    def __init__(self, group: WorkerGroup) -> None:
        have = group.method_specs()
        want = registered_methods(self.worker_cls)
        missing = sorted(set(want) - set(have))
        differ = sorted(name for name in set(want) & set(have)
                        if (want[name].dispatch_mode, want[name].execute_mode, want[name].blocking)
                        != (have[name].dispatch_mode, have[name].execute_mode, have[name].blocking))
        if missing or differ:
            raise TypeError(
                f"{type(self).__name__} drives {self.worker_cls.__name__}, but this group (of "
                f"{group.worker_cls.__name__}) lacks {missing} and registers {differ} differently"
            )
        self.group = group

    @property
    def world_size(self) -> int:
        return self.group.world_size

    def process_info(self) -> list[dict]:
        """Each rank's pid, host, rank and thread count."""
        return self.group.call(Worker.process_info)

    def process_memory(self) -> list[ProcessMemory]:
        """Each rank's process's peak memory."""
        return self.group.call(Worker.process_memory)

    def model_passes(self) -> list[dict[str, ModelPass]]:
        """Each rank's model passes, by name, for MFU (the role's worker class says which it runs)."""
        return self.group.call(Worker.model_passes)


DIST_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


# The local backend: a world-size-1 group whose only rank lives in the driver process.
#
# Same API as RayWorkerGroup, no Ray: a breakpoint inside a worker method stops the driver itself, so a
# whole PPO step can be stepped through in an ordinary debugger.
#
# The rank's torch.distributed coordinates and its device type (`hybridrl.utils.device`) are environment
# variables of the driver process itself, and its process group is the driver's. `shutdown` puts both back
# as they were before the group started, so a second run in the same process starts afresh and a child
# process inherits nothing of the first.
def _set_single_rank_env() -> None:
    # A driver that already joined a process group (a second local group) keeps its coordinates.
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # 0: the rank binds a port of the OS's choosing when it starts its store; none is picked ahead (worker.rank_store)
    os.environ.setdefault("MASTER_PORT", "0")
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}.items():
        if os.environ.setdefault(key, value) != value:
            raise RuntimeError(
                f"the local backend runs one rank in this process, but {key}={os.environ[key]} is set; "
                f"unset it or use trainer.backend=ray"
            )


def restore_env(saved: dict[str, str | None]) -> None:
    """Put environment variables back to `saved` values (None: the variable was unset)."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


class _Release:
    """What shutting the group down must undo; one object shared by the group and its role views
    (`spawn` copies the group), so whichever shuts down first undoes it, and only once."""

    def __init__(self) -> None:
        self.saved_env: dict[str, str | None] | None = {key: os.environ.get(key)
                                                         for key in (*DIST_ENV_KEYS, DEVICE_ENV)}
        # a group nested inside another (same process group) must leave the outer one's group open
        self.owns_process_group = not dist.is_initialized()

    def __call__(self) -> None:
        if self.saved_env is None:
            return
        if self.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        restore_env(self.saved_env)
        self.saved_env = None


class LocalWorkerGroup(WorkerGroup):
    """One rank, built and run in the calling process.

    device: the rank's device type, `trainer.device` (cpu / cuda / auto); None keeps this process's own
    (`hybridrl.utils.device.device_type`), e.g. inside a test's CPU-pinned rank.
    """

    def __init__(self, cls_with_init: ClassWithInitArgs, device: str | None = None) -> None:
        self._release = _Release()
        try:
            _set_single_rank_env()
            if device is not None:
                os.environ.update(device_env(resolve_device_type(device)))
            self.worker = cls_with_init.build()
        except BaseException:
            self._release()
            raise
        super().__init__(cls_with_init.cls, world_size=1)

    def _submit(self, rank: int, method_name: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self.worker, method_name)(*args, **kwargs)

    def shutdown(self) -> None:
        """Drop the rank, close the process group it opened and restore the distributed env variables."""
        self.worker = None
        self._release()
