"""The local backend: a world-size-1 group whose only rank lives in the driver process.

Same API as RayWorkerGroup, no Ray: a breakpoint inside a worker method stops the driver itself, so a
whole PPO step can be stepped through in an ordinary debugger.
"""

from __future__ import annotations

import os
from typing import Any

from hybridrl.controller.worker import free_port
from hybridrl.controller.worker_group import ClassWithInitArgs, WorkerGroup


def _set_single_rank_env() -> None:
    # A driver that already joined a process group (a second local group) keeps its coordinates.
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}.items():
        if os.environ.setdefault(key, value) != value:
            raise RuntimeError(
                f"the local backend runs one rank in this process, but {key}={os.environ[key]} is set; "
                f"unset it or use trainer.backend=ray"
            )


class LocalWorkerGroup(WorkerGroup):
    """One rank, built and run in the calling process."""

    def __init__(self, cls_with_init: ClassWithInitArgs) -> None:
        _set_single_rank_env()
        self.worker = cls_with_init.build()
        super().__init__(cls_with_init.cls, world_size=1)

    def _submit(self, rank: int, method_name: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self.worker, method_name)(*args, **kwargs)

    def shutdown(self) -> None:
        self.worker = None
