"""Typed handles on worker groups: one explicit method per worker method, for readers and type checkers.

A `WorkerGroup` binds its worker class's registered methods when it starts, so `wg.compute_values`
exists for Python but not for an editor or a type checker. A typed handle declares each method with the
worker's signature and hands the call to the group together with the worker method itself:

    class CriticGroup(TypedWorkerGroup):
        worker_cls = CriticWorker

        def compute_values(self, data: DataProto) -> DataProto:
            return self.group.call(CriticWorker.compute_values, data)

Jump-to-definition goes from a trainer's call to the handle's method, and from there to the worker's.
Dispatch, execution on the ranks and collection are `WorkerGroup.call`'s, the same as for the bound
methods. The return type is what the dispatch mode collects: a DataProto for DP_COMPUTE_PROTO, a list
with one entry per rank for ONE_TO_ALL; a handle returns None where every rank returns None.
"""

from __future__ import annotations

from typing import ClassVar

from hybridrl.controller.decorator import registered_methods
from hybridrl.controller.worker import Worker
from hybridrl.controller.worker_group import WorkerGroup
from hybridrl.utils.device import ProcessMemory
from hybridrl.utils.flops import ModelPass


class TypedWorkerGroup:
    """Base of the typed handles: holds the group and the methods every `Worker` has."""

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
