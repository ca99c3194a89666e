"""The local backend: a world-size-1 group whose only rank lives in the driver process.

Same API as RayWorkerGroup, no Ray: a breakpoint inside a worker method stops the driver itself, so a
whole PPO step can be stepped through in an ordinary debugger.

The rank's torch.distributed coordinates and its device type (`hybridrl.utils.device`) are environment
variables of the driver process itself, and its process group is the driver's. `shutdown` puts both back
as they were before the group started, so a second run in the same process starts afresh and a child
process inherits nothing of the first.
"""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist

from hybridrl.controller.worker_group import ClassWithInitArgs, WorkerGroup
from hybridrl.utils.device import DEVICE_ENV, device_env, resolve_device_type

DIST_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


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
