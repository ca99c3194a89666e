"""The Ray backend: one Ray actor per rank, placed in the bundles of a RayResourcePool."""

from __future__ import annotations

import math
import uuid
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybridrl.controller.ray_resources import RayResourcePool, register_torch_module_reducers
from hybridrl.controller.rendezvous import RENDEZVOUS_KEY_ENV, await_address
from hybridrl.controller.worker import NUM_THREADS_ENV
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
        share = 1.0 / pool.max_colocate_count
        threads = max(1, math.floor(pool.cpus_per_process * share))
        remote_cls = ray.remote(cls_with_init.cls)
        options = getattr(cls_with_init, "actor_options", {})
        group_id = uuid.uuid4().hex[:8]
        # Rank 0 binds its store on a port of the OS's choosing and announces it; the other ranks start
        # once it has (rendezvous.py): no port is picked ahead of its bind, where another process could take it.
        master = ("127.0.0.1", 0)
        rendezvous_key = f"hybridrl/rendezvous/{self.name_prefix}/{group_id}"
        workers, rank = [], 0
        for group, n_local in zip(groups, pool.process_on_nodes, strict=True):
            for local_rank in range(n_local):
                env = rank_environment(pool, rank, local_rank, n_local, master, threads)
                if rank == 0 and pool.world_size > 1:
                    env[RENDEZVOUS_KEY_ENV] = rendezvous_key
                runtime_env = dict(options.get("runtime_env", {}))
                runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **env}
                actor = remote_cls.options(
                    **{k: v for k, v in options.items() if k != "runtime_env"},
                    scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=local_rank),
                    num_cpus=pool.cpus_per_process * share,
                    num_gpus=share if pool.use_gpu else 0,
                    runtime_env=runtime_env,
                    name=f"{self.name_prefix}_{rank}_{group_id}",
                ).remote(*cls_with_init.args, **cls_with_init.kwargs)
                workers.append(actor)
                if rank == 0 and pool.world_size > 1:
                    try:
                        master = await_address(rendezvous_key, actor)
                    except BaseException:
                        ray.kill(actor)
                        raise
                rank += 1
        return workers

    def _submit(self, rank: int, method_name: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self.workers[rank], method_name).remote(*args, **kwargs)

    def shutdown(self) -> None:
        """Kill this group's actors (the resource pool stays reserved for reuse)."""
        for actor in self.workers:
            ray.kill(actor)
        self.workers = []
