"""How the ranks of a worker group find each other: rank 0 hosts torch.distributed's TCP store.

A port picked free in one place and bound later in another can be taken in between: gloo binds
ephemeral ports for its connections, so two runs (or a run beside the test suite) on one machine
collided that way (EADDRINUSE on the rank-0 port, seen in CI). So no port is chosen ahead of its bind:
`MASTER_PORT=0` tells rank 0 to bind a port of the operating system's choosing, atomically, and the other
ranks learn that port from it afterwards:

- world size 1 (the local backend, a Ray group of one): nobody else needs the port;
- a Ray group of several ranks: the group starts rank 0 with `RENDEZVOUS_KEY_ENV` set; rank 0 announces
  `ip:port` under that key in Ray's key-value store (`announce_address`) and the driver, waiting on it
  (`await_address`), starts the other ranks with the port filled in.

A port given outright (`MASTER_PORT=29500`, as torchrun and a user's own launcher give it) is used as it
is. Every rank builds its store here, so all of them agree on the store's keys.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

# Set by the Ray worker group on rank 0 of a group of several ranks: the key rank 0 announces its address under.
RENDEZVOUS_KEY_ENV = "HYBRIDRL_RENDEZVOUS_KEY"


@dataclass(frozen=True)
class DistEnv:
    """The torch.distributed coordinates of one rank."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int

    @classmethod
    def from_environ(cls) -> DistEnv:
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise RuntimeError(
                f"worker started without {missing} in its environment; create workers through a "
                f"WorkerGroup (RayWorkerGroup or LocalWorkerGroup), which sets them"
            )
        world_size = int(os.environ["WORLD_SIZE"])
        return cls(
            rank=int(os.environ["RANK"]),
            world_size=world_size,
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size))),
            master_addr=os.environ["MASTER_ADDR"],
            master_port=int(os.environ["MASTER_PORT"]),
        )


def rank_store(env: DistEnv) -> dist.TCPStore:
    """The rank's client of the group's TCP store; rank 0 also hosts it (its server listens on every
    interface of rank 0's node)."""
    if env.master_port != 0:
        return dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master=env.rank == 0,
                             timeout=default_pg_timeout, wait_for_workers=False)
    if env.rank != 0:
        raise RuntimeError(
            f"rank {env.rank} was started with MASTER_PORT=0, which only rank 0 may have (it binds a port of "
            f"the operating system's choosing); start rank {env.rank} with the port rank 0 bound"
        )
    key = os.environ.get(RENDEZVOUS_KEY_ENV)
    if env.world_size > 1 and not key:
        raise RuntimeError(
            f"MASTER_PORT=0 in a group of {env.world_size} ranks, but rank 0 has nowhere to announce the port "
            f"it binds ({RENDEZVOUS_KEY_ENV} is unset): give every rank the same MASTER_PORT, or start the "
            f"group through RayWorkerGroup"
        )
    store = dist.TCPStore(env.master_addr, 0, env.world_size, is_master=True, timeout=default_pg_timeout,
                          wait_for_workers=False)
    if env.world_size > 1:
        announce_address(key, store.port)
    return store


def announce_address(key: str, port: int) -> None:
    """Rank 0 of a Ray group: publish `node-ip:port` under `key` for the driver."""
    import ray
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put(key, f"{ray.util.get_node_ip_address()}:{port}".encode(), overwrite=True)


def await_address(key: str, rank0: Any, timeout_s: float = default_pg_timeout.total_seconds()) -> tuple[str, int]:
    """The driver: wait until the Ray actor `rank0` announces its store's address under `key`.

    Raises rank 0's own error if its construction fails first (a bad model path, say), instead of
    leaving the driver waiting on an address that will never come.
    """
    import ray
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_get

    constructed = rank0.__ray_ready__.remote()
    deadline = time.monotonic() + timeout_s
    while True:
        value = _internal_kv_get(key)
        if value is not None:
            _internal_kv_del(key)
            host, port = value.decode().rsplit(":", 1)
            return host, int(port)
        finished, _ = ray.wait([constructed], timeout=0.05)
        if finished:
            ray.get(constructed)  # raises the constructor's error
            if _internal_kv_get(key) is None:
                raise RuntimeError(
                    "rank 0 of the worker group finished construction without joining a process group; "
                    "worker classes must call hybridrl.controller.Worker.__init__"
                )
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 of the worker group did not bind its store in {timeout_s:.0f} s")
