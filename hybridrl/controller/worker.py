"""Worker: the base class of every SPMD rank, and how ranks meet: it reads the torch.distributed environment
its worker group set (`DistEnv`) and joins the group's process group on a TCP store rank 0 hosts."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from hybridrl.controller.decorator import Dispatch, register
from hybridrl.utils.device import (
    ProcessMemory,
    device_type,
    distributed_backend,
    keep_freed_memory,
    local_device,
    process_memory,
)
from hybridrl.utils.metric import ModelPass, device_peak_flops

# Set by the Ray worker group on every rank of a group of several: the key rank 0 announces its address under.
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
    """The rank's client of the group's TCP store, which rank 0 hosts; `MASTER_PORT=0` has rank 0 bind a port of
    the OS's choosing (none picked ahead, which another process could take) and announce it for the others."""
    if env.master_port != 0:
        return dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master=env.rank == 0,
                             timeout=default_pg_timeout, wait_for_workers=False)
    if env.rank != 0:
        raise RuntimeError(
            f"rank {env.rank} was started with MASTER_PORT=0, which only rank 0 may have (it binds a port of "
            f"the operating system's choosing); start rank {env.rank} with the port rank 0 bound, or with "
            f"{RENDEZVOUS_KEY_ENV} naming where rank 0 announces it"
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
    if env.world_size > 1:  # publish `node-ip:port` for the driver and the other ranks
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(key, f"{node_address()}:{store.port}".encode(), overwrite=True)
    return store


def await_master(env: DistEnv, timeout_s: float = default_pg_timeout.total_seconds()) -> DistEnv:
    """`env` with rank 0's store address, for a rank other than 0 that a Ray group started alongside rank 0
    (MASTER_PORT=0 and the group's rendezvous key): all ranks import and construct at once, and only the
    store waits for rank 0's bind. Any other `env` comes back as it is."""
    key = os.environ.get(RENDEZVOUS_KEY_ENV)
    if env.rank == 0 or env.master_port != 0 or not key:
        return env
    from ray.experimental.internal_kv import _internal_kv_get

    deadline, wait = time.monotonic() + timeout_s, 0.02
    while (value := _internal_kv_get(key)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {env.rank}: rank 0 did not announce its store's address under {key!r} in "
                               f"{timeout_s:.0f} s")
        time.sleep(wait)
        wait = min(2 * wait, 0.2)  # every rank of a large group polls Ray's KV: back off once rank 0 is slow
    host, port = value.decode().rsplit(":", 1)
    return replace(env, master_addr=host, master_port=int(port))


def node_address() -> str:
    """This node's address as its Ray cluster knows it (other nodes reach it there); 127.0.0.1 outside Ray."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray.util.get_node_ip_address()
    return "127.0.0.1"


def await_address(key: str, rank0: Any, timeout_s: float = default_pg_timeout.total_seconds()) -> None:
    """The driver: wait until the Ray actor `rank0` announces its store's address under `key` (left there for the
    other ranks); raises rank 0's own error if its construction fails first."""
    import ray
    from ray.experimental.internal_kv import _internal_kv_get

    constructed = rank0.__ray_ready__.remote()
    deadline = time.monotonic() + timeout_s
    while _internal_kv_get(key) is None:
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


# torch.distributed's network interfaces: set on the driver, every rank gets them (names alike on every host)
SOCKET_INTERFACE_ENVS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
# How long a rank tries to reach the other ranks' addresses before it fails naming them.
REACH_TIMEOUT_S = 60.0


def interface_addresses() -> dict[str, list[str]]:
    """This host's network interfaces and their IPv4/IPv6 addresses, by interface name."""
    import psutil

    families = (socket.AF_INET, socket.AF_INET6)
    return {name: [a.address.split("%")[0] for a in addresses if a.family in families]
            for name, addresses in psutil.net_if_addrs().items()}


def bind_sockets_to_node_address() -> str | None:
    """In a Ray actor: the address other hosts reach this rank at, gloo and NCCL bound to its interface (gloo
    otherwise advertises the hostname's, often loopback). None in the driver and where Ray's node is loopback."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return None
    node = node_address()
    if node.startswith("127.") or node == "::1":
        return None
    address, interface = socket_address(node, interface_addresses(), os.environ.get("GLOO_SOCKET_IFNAME"))
    os.environ["GLOO_SOCKET_IFNAME"] = os.environ.get("GLOO_SOCKET_IFNAME") or interface
    os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
    return address


def socket_address(node: str, interfaces: dict[str, list[str]], chosen: str | None) -> tuple[str, str]:
    """(address, interface) a rank listens on: Ray's node address `node` on the interface holding it, or the
    address of the first interface of GLOO_SOCKET_IFNAME (`chosen`) where set."""
    if chosen:
        first = chosen.split(",")[0]
        if first not in interfaces:
            raise RuntimeError(f"GLOO_SOCKET_IFNAME={chosen} names no interface of this host; it has "
                               f"{sorted(interfaces)} (interface names must be the same on every host)")
        if not interfaces[first]:
            raise RuntimeError(f"GLOO_SOCKET_IFNAME={chosen}: interface {first} has no address")
        return interfaces[first][0], first
    holder = next((name for name, addresses in interfaces.items() if node in addresses), None)
    if holder is None:
        raise RuntimeError(f"Ray's node address {node} is on no interface of this host ({interfaces}); start the "
                           f"node with ray start --node-ip-address=<an address of this host>, or set "
                           f"GLOO_SOCKET_IFNAME to the interface the other hosts reach")
    return node, holder


def check_store_reachable(host: str, port: int, rank: int, address: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Fail within `timeout_s`, naming both addresses, if the store is out of reach (its client retries 30 min)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=max(1.0, deadline - time.monotonic())).close()
            return
        except OSError as err:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"rank {rank} at {address} cannot reach its group's store at {host}:{port} ({err}); check the "
                    f"route and firewall between the hosts (docs/multinode.md)") from err
            time.sleep(0.5)


def check_ranks_reach_each_other(store: dist.Store, rank: int, world_size: int, address: str,
                                 timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Every rank listens on its address and connects to the ranks on other addresses, so that ranks that cannot
    reach each other fail within `timeout_s` naming both addresses, not after the process group's timeout."""
    listener = socket.create_server((address, 0), family=socket.AF_INET6 if ":" in address else socket.AF_INET)
    try:
        store.set(f"hybridrl/reach/{rank}", f"{address}|{listener.getsockname()[1]}")
        peers = [store.get(f"hybridrl/reach/{peer}").decode().split("|") for peer in range(world_size)]
        failures = []
        if len({host for host, _ in peers}) > 1:
            deadline = time.monotonic() + timeout_s
            for peer, (host, port) in enumerate(peers):
                if host == address:
                    continue
                try:
                    socket.create_connection((host, int(port)), timeout=max(1.0, deadline - time.monotonic())).close()
                except OSError as err:
                    failures.append(f"rank {rank} at {address} cannot reach rank {peer} at {host}:{port} ({err})")
        store.set(f"hybridrl/reach/{rank}/failures", "\n".join(failures))
        reports = [store.get(f"hybridrl/reach/{peer}/failures").decode() for peer in range(world_size)]
    finally:
        listener.close()
    lost = [line for report in reports for line in report.splitlines()]
    if lost:
        raise RuntimeError(
            "the ranks of this group cannot all reach each other: " + "; ".join(lost) + ". Each rank listens on the "
            "address of its Ray node, or of GLOO_SOCKET_IFNAME's interface where set: set GLOO_SOCKET_IFNAME / "
            "NCCL_SOCKET_IFNAME to an interface the other hosts reach, and open the ports between the hosts "
            "(docs/multinode.md)")


# Set by the worker group: how many intra-op threads this rank should use.
NUM_THREADS_ENV = "HYBRIDRL_NUM_THREADS"


def init_distributed(env: DistEnv, collective_timeout_s: float | None = None) -> None:
    """Join the group's process group once per process (colocated roles share it: the first to join sets
    how long a collective waits, `collective_timeout_s`, torch's default when None)."""
    if dist.is_initialized():
        if dist.get_world_size() != env.world_size or dist.get_rank() != env.rank:
            raise RuntimeError(
                f"this process already belongs to a process group as rank {dist.get_rank()} of "
                f"{dist.get_world_size()}, but a worker asked for rank {env.rank} of {env.world_size}"
            )
        return
    if device_type() == "cuda":
        torch.cuda.set_device(local_device(env.local_rank))
    address = bind_sockets_to_node_address()  # also for the groups a rank makes later (the weight sync's)
    if address is not None and env.rank != 0:
        check_store_reachable(env.master_addr, env.master_port, env.rank, address)
    store = rank_store(env)  # MASTER_PORT=0: rank 0 binds a port of the OS's choosing (rank_store)
    if address is not None and env.world_size > 1:
        check_ranks_reach_each_other(store, env.rank, env.world_size, address)
    global _collective_timeout
    _collective_timeout = None if collective_timeout_s is None else timedelta(seconds=collective_timeout_s)
    dist.init_process_group(
        backend=distributed_backend(),
        store=store,
        rank=env.rank,
        world_size=env.world_size,
        timeout=_collective_timeout,
    )


_collective_timeout: timedelta | None = None  # the process group's, as init_distributed set it


def collective_timeout() -> timedelta | None:
    """How long this process's collectives wait (None: torch's default): subgroups made later wait as long."""
    return _collective_timeout


class Worker:
    """Base class of SPMD workers. Subclasses call `super().__init__()` first; `collective_timeout_s` is how
    long the process group's collectives wait for a slow rank (the first role of a process sets it)."""

    def __init__(self, collective_timeout_s: float | None = None) -> None:
        self.dist_env = await_master(DistEnv.from_environ())
        self.rank = self.dist_env.rank
        self.world_size = self.dist_env.world_size
        self.local_rank = self.dist_env.local_rank
        threads = os.environ.get(NUM_THREADS_ENV)
        if threads:
            torch.set_num_threads(int(threads))
        keep_freed_memory()  # activations reuse freed heap pages instead of faulting in fresh ones
        init_distributed(self.dist_env, collective_timeout_s)

    @property
    def device(self) -> torch.device:
        """Where this rank computes: the CPU, or its CUDA device (`hybridrl.utils.device.cuda_index`)."""
        return local_device(self.local_rank)

    def measure_peak_flops(self, dtypes: Iterable[torch.dtype]) -> None:
        """Measure this process's peak FLOP/s in each dtype once (`device_peak_flops` caches it); a collective.
        On CPU the ranks of a node take turns, since they share its cores."""
        dtypes = list(dtypes)
        turns = 1
        if device_type() == "cpu" and dist.is_initialized() and self.world_size > 1:
            most = torch.tensor([self.dist_env.local_world_size], device="cpu")  # a count: gloo reduces it
            dist.all_reduce(most, op=dist.ReduceOp.MAX)
            turns = int(most.item())
        for turn in range(turns):
            if turns == 1 or self.local_rank == turn:
                for dtype in dtypes:
                    device_peak_flops(dtype)
            if turns > 1:
                dist.barrier()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def process_info(self) -> dict:
        """Where this rank runs: for placement checks and debugging."""
        return {
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "node": node_address(),
            "rank": self.rank,
            "world_size": self.world_size,
            "num_threads": torch.get_num_threads(),
            "device": str(self.device),
            "backend": dist.get_backend() if dist.is_initialized() else None,
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def process_memory(self) -> ProcessMemory:
        """This rank's process's peak memory (RSS; CUDA allocator peaks where used)."""
        return process_memory()  # the module function, not this method

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def model_passes(self) -> dict[str, ModelPass]:
        """The model passes this rank runs, by name, for MFU (`perf/mfu/<name>`); none by default."""
        return {}


class HybridWorker(Worker):
    """Every role of a run in one process per rank, sharing the rank's device and process group; `roles` maps
    each role's name to its `ClassWithInitArgs`, which `WorkerGroup.call_role` reaches through `execute_role`."""

    def __init__(self, roles: Mapping[str, Any]) -> None:
        super().__init__()
        self.roles = {role: spec.build() for role, spec in roles.items()}

    def execute_role(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run role `role`'s registered `method` on this rank (its dispatch wrapper opens the arguments)."""
        return getattr(self.roles[role], method)(*args, **kwargs)
