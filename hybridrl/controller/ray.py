"""The Ray backend: one Ray actor per rank, placed in the bundles of a RayResourcePool."""

from __future__ import annotations

import math
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybridrl.controller.ray_resources import RayResourcePool, register_torch_module_reducers
from hybridrl.controller.worker import NUM_THREADS_ENV, free_port
from hybridrl.controller.worker_group import ClassWithInitArgs, WorkerGroup
from hybridrl.utils.device import device_env


class RayClassWithInitArgs(ClassWithInitArgs):
    """A worker class, its constructor arguments, and extra Ray actor options (e.g. runtime_env)."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        # Accept a class already wrapped by @ray.remote, as verl users pass one.
        metadata = getattr(cls, "__ray_metadata__", None)
        super().__init__(metadata.modified_class if metadata is not None else cls, *args, **kwargs)
        self.actor_options: dict[str, Any] = {}

    def update_options(self, options: dict[str, Any]) -> None:
        self.actor_options.update(options)


@ray.remote(num_cpus=0)
def _master_address() -> tuple[str, int]:
    """Runs in rank 0's bundle: the address other ranks use to reach it."""
    ip = ray.util.get_node_ip_address()
    return ip, free_port(ip)


def rank_environment(pool: RayResourcePool, rank: int, local_rank: int, n_local: int,
                     master: tuple[str, int], threads: int) -> dict[str, str]:
    """What one rank's actor finds in its environment: its torch.distributed coordinates, its share of
    CPU threads and its device type. GPU bundles are what trainer.device=cuda reserves; without them the
    ranks compute on the CPU, even on a node whose GPUs torch could see."""
    return {
        "RANK": str(rank), "WORLD_SIZE": str(pool.world_size),
        "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(n_local),
        "MASTER_ADDR": master[0], "MASTER_PORT": str(master[1]),
        NUM_THREADS_ENV: str(threads), "OMP_NUM_THREADS": str(threads),
        **device_env("cuda" if pool.use_gpu else "cpu"),
    }


class RayWorkerGroup(WorkerGroup):
    """Spawns `resource_pool.world_size` actors of one worker class and drives them as a group."""

    def __init__(
        self,
        resource_pool: RayResourcePool,
        ray_cls_with_init: ClassWithInitArgs,
        name_prefix: str | None = None,
    ) -> None:
        register_torch_module_reducers()
        self.resource_pool = resource_pool
        self.name_prefix = name_prefix or ray_cls_with_init.cls.__name__
        self.workers = self._spawn(resource_pool, ray_cls_with_init)
        super().__init__(ray_cls_with_init.cls, world_size=len(self.workers))

    def _spawn(self, pool: RayResourcePool, cls_with_init: ClassWithInitArgs) -> list:
        groups = pool.get_placement_groups()
        first_bundle = PlacementGroupSchedulingStrategy(groups[0], placement_group_bundle_index=0)
        master_addr, master_port = ray.get(_master_address.options(scheduling_strategy=first_bundle).remote())
        share = 1.0 / pool.max_colocate_count
        threads = max(1, math.floor(pool.cpus_per_process * share))
        remote_cls = ray.remote(cls_with_init.cls)
        options = getattr(cls_with_init, "actor_options", {})
        workers, rank = [], 0
        for group, n_local in zip(groups, pool.process_on_nodes, strict=True):
            for local_rank in range(n_local):
                env = rank_environment(pool, rank, local_rank, n_local, (master_addr, master_port), threads)
                runtime_env = dict(options.get("runtime_env", {}))
                runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **env}
                actor = remote_cls.options(
                    **{k: v for k, v in options.items() if k != "runtime_env"},
                    scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=local_rank),
                    num_cpus=pool.cpus_per_process * share,
                    num_gpus=share if pool.use_gpu else 0,
                    runtime_env=runtime_env,
                    name=f"{self.name_prefix}_{rank}_{master_port}",
                ).remote(*cls_with_init.args, **cls_with_init.kwargs)
                workers.append(actor)
                rank += 1
        return workers

    def _submit(self, rank: int, method_name: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self.workers[rank], method_name).remote(*args, **kwargs)

    def shutdown(self) -> None:
        """Kill this group's actors (the resource pool stays reserved for reuse)."""
        for actor in self.workers:
            ray.kill(actor)
        self.workers = []
