"""The Ray backend: `RayResourcePool` reserves one STRICT_PACK placement group per node with a bundle per
rank; `RayWorkerGroup` places one actor of the worker class in each bundle."""

from __future__ import annotations

import copyreg
import importlib
import itertools
import math
import os
import sys
import types
import uuid
import warnings
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybridrl.controller.worker import (
    NUM_THREADS_ENV,
    RENDEZVOUS_KEY_ENV,
    SOCKET_INTERFACE_ENVS,
    await_address,
)
from hybridrl.controller.worker_group import ClassWithInitArgs, WorkerGroup, roles_of
from hybridrl.utils.cpu_threads import POLICY_ENV
from hybridrl.utils.device import device_env

# How long to wait for a placement group that the cluster could hold but has not granted yet.
PLACEMENT_TIMEOUT_S = 60.0


def register_torch_module_reducers() -> None:
    """Let cloudpickle export classes whose code refers to torch's config modules: torch >= 2.11 makes them a
    module subclass, which cloudpickle cannot pickle ("cannot pickle 'ConfigModuleInstance' object")."""
    config_module_type = getattr(importlib.import_module("torch.utils._config_module"), "ConfigModule", None)
    if config_module_type is None:
        return
    for module in list(sys.modules.values()):
        if isinstance(module, config_module_type) and type(module) is not types.ModuleType:
            copyreg.pickle(type(module), _reduce_module_by_name)


def _reduce_module_by_name(module: types.ModuleType):
    return importlib.import_module, (module.__name__,)


def init_ray(
    num_cpus: int | None = None,
    object_store_memory: int | None = 512 * 1024**2,
    include_dashboard: bool = False,
    address: str | None = None,
) -> None:
    """Join a running cluster (address or RAY_ADDRESS) or start a small local one (no dashboard, a small
    object store: Ray's defaults cost a small machine more than the work)."""
    register_torch_module_reducers()
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no auth token written into the home directory
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address or os.environ["RAY_ADDRESS"])
        return
    ray.init(
        num_cpus=num_cpus or os.cpu_count(),
        object_store_memory=object_store_memory,
        include_dashboard=include_dashboard,
        runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
    )


class RayResourcePool:
    """Processes to place on each node (`process_on_nodes`, e.g. [4, 4]), one STRICT_PACK placement group per
    node; `max_colocate_count` worker groups may share each bundle (each gets a fraction)."""

    def __init__(
        self,
        process_on_nodes: list[int],
        use_gpu: bool = False,
        max_colocate_count: int = 1,
        cpus_per_process: float = 1.0,
        name_prefix: str = "hybridrl",
    ) -> None:
        if not process_on_nodes or any(n <= 0 for n in process_on_nodes):
            raise ValueError(f"process_on_nodes must list a positive process count per node, got {process_on_nodes}")
        self.process_on_nodes = list(process_on_nodes)
        self.use_gpu = use_gpu
        self.max_colocate_count = max_colocate_count
        self.cpus_per_process = cpus_per_process
        self.name_prefix = name_prefix
        self._placement_groups: list[PlacementGroup] | None = None
        self.node_addresses: list[str] = []  # of each node group, once placed

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    def bundle(self) -> dict[str, float]:
        return {"CPU": self.cpus_per_process, **({"GPU": 1.0} if self.use_gpu else {})}

    def get_placement_groups(self) -> list[PlacementGroup]:
        if self._placement_groups is None:
            self._check_cluster_can_hold()
            nodes = self._distinct_nodes()
            groups = [
                placement_group([{**self.bundle(), **({f"node:{nodes[i]}": 0.001} if nodes else {})}] * n,
                                strategy="STRICT_PACK", name=f"{self.name_prefix}_node{i}")
                for i, n in enumerate(self.process_on_nodes)
            ]
            self._wait_ready(groups)
            self._placement_groups = groups
            self.node_addresses = [placement_node(group) for group in groups]
        return self._placement_groups

    def placed(self) -> str:
        """Where the pool's node groups landed, for the run's log (once placed)."""
        return f"  {self.name_prefix:<12} placed on node(s) {', '.join(self.node_addresses)}"

    def _distinct_nodes(self) -> list[str] | None:
        """One alive node address per entry of `process_on_nodes` that can hold it (the head first), so that
        `nnodes` means separate hosts; None for a single node, or (with a warning) when too few nodes can."""
        if len(self.process_on_nodes) == 1:
            return None
        need = max(self.process_on_nodes)
        fits = [node for node in ray.nodes() if node.get("Alive")
                and node["Resources"].get("CPU", 0.0) >= need * self.cpus_per_process
                and (not self.use_gpu or node["Resources"].get("GPU", 0.0) >= need)]
        fits.sort(key=lambda node: ("node:__internal_head__" not in node["Resources"], node["NodeManagerAddress"]))
        if len(fits) < len(self.process_on_nodes):
            warnings.warn(f"pool {self.name_prefix!r} asks for {len(self.process_on_nodes)} nodes of {need} processes "
                          f"but the Ray cluster has {len(fits)} node(s) that can hold them: its node groups share "
                          f"nodes (on one machine, set nnodes=1 and n_gpus_per_node to the process count)",
                          stacklevel=3)
            return None
        return [node["NodeManagerAddress"] for node in fits[:len(self.process_on_nodes)]]

    def _check_cluster_can_hold(self) -> None:
        """Fail in seconds, naming the setting, instead of waiting forever for impossible bundles."""
        total = ray.cluster_resources()
        need_cpu = self.cpus_per_process * self.world_size
        have_cpu, have_gpu = total.get("CPU", 0.0), total.get("GPU", 0.0)
        if need_cpu > have_cpu:
            raise RuntimeError(
                f"the resource pool needs {self.world_size} processes x {self.cpus_per_process} CPU = {need_cpu:g} "
                f"CPUs but the Ray cluster has {have_cpu:g}. Lower trainer.n_gpus_per_node / trainer.nnodes "
                f"(on CPU they count worker processes), or start Ray with more CPUs (ray start --num-cpus, "
                f"or ray_init.num_cpus for a local cluster)."
            )
        if self.use_gpu and self.world_size > have_gpu:
            raise RuntimeError(
                f"the resource pool needs {self.world_size} GPUs but the Ray cluster has {have_gpu:g}. "
                f"Lower trainer.n_gpus_per_node / trainer.nnodes, or use trainer.device=cpu."
            )
        per_node = max(self.process_on_nodes)
        node_cpus = [n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")]
        if node_cpus and per_node * self.cpus_per_process > max(node_cpus):
            raise RuntimeError(
                f"one node must host {per_node} processes x {self.cpus_per_process} CPU but the largest node has "
                f"{max(node_cpus):g} CPUs; spread the processes over more nodes (trainer.nnodes)"
            )

    def _wait_ready(self, groups: list[PlacementGroup]) -> None:
        try:
            ray.get([g.ready() for g in groups], timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            for g in groups:
                remove_placement_group(g)
            raise RuntimeError(
                f"Ray did not grant {len(groups)} placement group(s) of bundles {self.bundle()} x "
                f"{self.process_on_nodes} within {PLACEMENT_TIMEOUT_S:.0f}s; free resources now: "
                f"{ray.available_resources()}. Other jobs or earlier worker groups may hold them."
            ) from None

    def remove(self) -> None:
        for g in self._placement_groups or []:
            remove_placement_group(g)
        self._placement_groups = None


def placement_node(group: PlacementGroup) -> str:
    """The address of the node a (ready, STRICT_PACK) placement group's bundles are on."""
    node_ids = set(placement_group_table(group)["bundles_to_node_id"].values())
    addresses = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    return ",".join(sorted(addresses.get(node_id, node_id) for node_id in node_ids))


class RayClassWithInitArgs(ClassWithInitArgs):
    """A worker class, its constructor arguments, and extra Ray actor options (e.g. runtime_env)."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        # Accept a class already wrapped by @ray.remote, as verl users pass one.
        metadata = getattr(cls, "__ray_metadata__", None)
        super().__init__(metadata.modified_class if metadata is not None else cls, *args, **kwargs)
        self.actor_options: dict[str, Any] = {}

    def update_options(self, options: dict[str, Any]) -> None:
        self.actor_options.update(options)


def rank_environment(pool: RayResourcePool, rank: int, local_rank: int, n_local: int,
                     master: tuple[str, int], threads: int) -> dict[str, str]:
    """One rank's actor environment: its torch.distributed coordinates, CPU threads, thread policy and device
    type (cuda exactly when the pool reserves GPUs)."""
    return {
        "RANK": str(rank), "WORLD_SIZE": str(pool.world_size),
        "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(n_local),
        "MASTER_ADDR": master[0], "MASTER_PORT": str(master[1]),
        NUM_THREADS_ENV: str(threads), "OMP_NUM_THREADS": str(threads),
        **device_env("cuda" if pool.use_gpu else "cpu"),
        # the driver's thread policy and socket interfaces reach ranks on nodes started without them
        **{name: os.environ[name] for name in (POLICY_ENV, *SOCKET_INTERFACE_ENVS) if name in os.environ},
    }


class RayWorkerGroup(WorkerGroup):
    """Spawns `resource_pool.world_size` actors of one worker class and drives them as a group."""

    def __init__(self, resource_pool: RayResourcePool, ray_cls_with_init: ClassWithInitArgs) -> None:
        register_torch_module_reducers()
        self.resource_pool = resource_pool
        self.name_prefix = f"{resource_pool.name_prefix}_{ray_cls_with_init.cls.__name__}"  # actors: <prefix>_<rank>_<id>
        self.workers = self._spawn(resource_pool, ray_cls_with_init)
        super().__init__(ray_cls_with_init.cls, world_size=len(self.workers), roles=roles_of(ray_cls_with_init))

    def _spawn(self, pool: RayResourcePool, cls_with_init: ClassWithInitArgs) -> list:
        groups = pool.get_placement_groups()
        share = 1.0 / pool.max_colocate_count
        threads = max(1, math.floor(pool.cpus_per_process * share))
        remote_cls = ray.remote(cls_with_init.cls)
        options = getattr(cls_with_init, "actor_options", {})
        group_id = uuid.uuid4().hex[:8]
        # rank 0 binds a port of the OS's choosing and announces it under the group's key, where the other ranks,
        # started alongside it, read it (worker.rank_store, worker.await_master)
        master = ("127.0.0.1", 0)
        self.rendezvous_key = f"hybridrl/rendezvous/{self.name_prefix}/{group_id}"
        workers, rank = [], 0
        for group, n_local in zip(groups, pool.process_on_nodes, strict=True):
            for local_rank in range(n_local):
                env = rank_environment(pool, rank, local_rank, n_local, master, threads)
                if pool.world_size > 1:
                    env[RENDEZVOUS_KEY_ENV] = self.rendezvous_key
                runtime_env = dict(options.get("runtime_env", {}))
                runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **env}
                workers.append(remote_cls.options(
                    **{k: v for k, v in options.items() if k != "runtime_env"},
                    scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=local_rank),
                    num_cpus=pool.cpus_per_process * share,
                    num_gpus=share if pool.use_gpu else 0,
                    runtime_env=runtime_env,
                    name=f"{self.name_prefix}_{rank}_{group_id}",
                ).remote(*cls_with_init.args, **cls_with_init.kwargs))
                rank += 1
        if pool.world_size > 1:
            try:
                await_address(self.rendezvous_key, workers[0])
            except BaseException:
                for actor in workers:
                    ray.kill(actor)
                self._forget_rendezvous()
                raise
        return workers

    def describe_rank(self, rank: int) -> str:
        """The rank, its pool, and its node with the pool's other ranks there (a lost node loses them all)."""
        pool = self.resource_pool
        label = f"rank {rank} of pool {pool.name_prefix!r}"
        if not pool.node_addresses:
            return label
        ends = list(itertools.accumulate(pool.process_on_nodes))  # each node group's last rank + 1
        group = next((g for g, end in enumerate(ends) if rank < end), None)
        if group is None:
            raise IndexError(f"rank {rank} is not in pool {pool.name_prefix!r}")
        first, last = ends[group] - pool.process_on_nodes[group], ends[group] - 1
        held = f" (which holds its ranks {first}-{last})" if last > first else ""
        return f"{label} on node {pool.node_addresses[group]}{held}"

    def results(self, futures: list, method: str | None = None) -> list:
        """As the base class, and a rank whose process died is named by its pool, rank and node (`get_naming_dead`)."""
        return get_naming_dead([(future, self.describe_rank(rank)) for rank, future in enumerate(futures)], method)

    def _submit(self, rank: int, role: str | None, method_name: str, args: tuple, kwargs: dict) -> Any:
        if role is None:
            return getattr(self.workers[rank], method_name).remote(*args, **kwargs)
        return self.workers[rank].execute_role.remote(role, method_name, *args, **kwargs)

    def shutdown(self) -> None:
        """Kill this group's actors (the resource pool stays reserved for reuse)."""
        for actor in self.workers:
            ray.kill(actor)
        self.workers = []
        self._forget_rendezvous()

    def _forget_rendezvous(self) -> None:
        from ray.experimental.internal_kv import _internal_kv_del

        if ray.is_initialized():
            _internal_kv_del(self.rendezvous_key)


class WorkerDiedError(RuntimeError):
    """A worker process of the run is gone; the message names its pool, rank, node and the call it was in."""


# After a rank's call fails, how long to wait for a peer's death, the likelier cause (gloo: "connection closed").
PEER_DEATH_WAIT_S = 10.0


def get_naming_dead(labelled: list[tuple[Any, str]], during: str | None = None) -> list:
    """The values of Ray futures, in order, waited on together so the first failure surfaces at once; a dead
    actor (or, after another error, a peer dying meanwhile) raises WorkerDiedError naming its label and `during`."""
    label_of = {future: label for future, label in labelled}
    pending = list(label_of)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(ready[0])
        except ray.exceptions.RayActorError as err:
            raise _died(label_of[ready[0]], during, err) from err
        except Exception as err:
            dead = _first_dead(pending, PEER_DEATH_WAIT_S)
            if dead is None:
                raise
            raise _died(label_of[dead[0]], during, dead[1]) from err
    return ray.get([future for future, _ in labelled])


def _first_dead(futures: list, timeout_s: float) -> tuple[Any, BaseException] | None:
    """The first of `futures` whose actor dies within `timeout_s`, with its error; None if none does."""
    ready, _ = ray.wait(futures, num_returns=len(futures), timeout=timeout_s)
    for future in ready:
        try:
            ray.get(future)
        except ray.exceptions.RayActorError as err:
            return future, err
        except Exception:
            continue
    return None


def _died(label: str, during: str | None, err: BaseException) -> WorkerDiedError:
    call = f" during {during}" if during else ""
    return WorkerDiedError(
        f"the worker process of {label} died{call} ({type(err).__name__}: its process was killed, crashed, ran out of "
        f"memory, or its node was lost); the run stops. Its last words, if any, are in Ray's logs on that node "
        f"(session_latest/logs under the node's Ray temp dir, /tmp/ray by default). {err}")
