"""The trainer's worker groups: the roles a run needs, started on their pools (placement.py), and a typed handle
per role (docs/architecture.md, "Worker groups and dispatch")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridrl.controller import (
    ClassWithInitArgs,
    TypedWorkerGroup,
    WorkerGroup,
    create_worker_group,
    hybrid_worker,
)
from hybridrl.protocol import DataProto
from hybridrl.trainer.placement import Pool, is_split, placement, uses_reference
from hybridrl.trainer.ppo_config import PPOTrainerConfig
from hybridrl.utils.device import ProcessMemory
from hybridrl.utils.metric import ModelPass, combine_ranks
from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker
from hybridrl.workers.reward_model import RewardModelWorker
from hybridrl.workers.sft_worker import SFTWorker
from hybridrl.workers.weight_sync import BucketPlan, WeightSync


class ActorRolloutRefGroup(TypedWorkerGroup):
    """Actor, rollout and (with a reference role) reference policy, on every rank of the pool."""

    worker_cls = ActorRolloutRefWorker

    def init_model(self) -> None:
        self._call(ActorRolloutRefWorker.init_model)

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """`rollout.n` responses per prompt, rows grouped by prompt (layout: hybridrl/workers/rollout/base.py)."""
        return self._call(ActorRolloutRefWorker.generate_sequences, prompts)

    def stream_generate(self, prompts: list[DataProto | None], max_steps: list[int],
                        partial: list[bool]) -> list[DataProto | None]:
        """Streaming: rank r's new prompts `prompts[r]` join its batch; each rank's finished groups (lists per rank)."""
        return self._call(ActorRolloutRefWorker.stream_generate, prompts, max_steps, partial)

    def stream_unfinished(self) -> list[DataProto | None]:
        """Streaming mode: each rank's prompts admitted or waiting, not finished."""
        return self._call(ActorRolloutRefWorker.stream_unfinished)

    def compute_log_prob(self, data: DataProto) -> DataProto:
        """`old_log_probs` and `entropys` under the current actor."""
        return self._call(ActorRolloutRefWorker.compute_log_prob, data)

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """`ref_log_prob` under the reference policy."""
        return self._call(ActorRolloutRefWorker.compute_ref_log_prob, data)

    def update_actor(self, data: DataProto) -> DataProto:
        """One policy update on the batch; the metrics come back in `meta_info["metrics"]`."""
        return self._call(ActorRolloutRefWorker.update_actor, data)

    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None) -> None:
        self._call(ActorRolloutRefWorker.save_checkpoint, local_path, hdfs_path, global_step, max_ckpt_to_keep)

    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None,
                        del_local_after_load: bool = False) -> None:
        self._call(ActorRolloutRefWorker.load_checkpoint, local_path, hdfs_path, del_local_after_load)

    # the weight sync between pools (workers/weight_sync.py); the last three hand back each rank's future, not blocking
    def weight_manifest(self) -> list[list[tuple[str, tuple[int, ...]]] | None]:
        return self._call(ActorRolloutRefWorker.weight_manifest)

    def rollout_weight_spec(self) -> list[dict[str, Any]]:
        return self._call(ActorRolloutRefWorker.rollout_weight_spec)

    def host_weight_sync(self) -> tuple[str, int]:
        return self._call(ActorRolloutRefWorker.host_weight_sync)

    def join_weight_sync(self, host: str, port: int, world_size: int, timeout_s: float) -> list[None]:
        return self._call(ActorRolloutRefWorker.join_weight_sync, host, port, world_size, timeout_s)

    def send_weights(self, plan: BucketPlan, version: int) -> list[dict[str, float]]:
        return self._call(ActorRolloutRefWorker.send_weights, plan, version)

    def receive_weights(self, plan: BucketPlan, version: int) -> list[dict[str, float]]:
        return self._call(ActorRolloutRefWorker.receive_weights, plan, version)


class CriticGroup(TypedWorkerGroup):
    """The value model."""

    worker_cls = CriticWorker

    def init_model(self) -> None:
        self._call(CriticWorker.init_model)

    def compute_values(self, data: DataProto) -> DataProto:
        """`values` of every response token."""
        return self._call(CriticWorker.compute_values, data)

    def update_critic(self, data: DataProto) -> DataProto:
        """One value update on the batch; the metrics come back in `meta_info["metrics"]`."""
        return self._call(CriticWorker.update_critic, data)

    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None) -> None:
        self._call(CriticWorker.save_checkpoint, local_path, hdfs_path, global_step, max_ckpt_to_keep)

    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None,
                        del_local_after_load: bool = False) -> None:
        self._call(CriticWorker.load_checkpoint, local_path, hdfs_path, del_local_after_load)


class RewardModelGroup(TypedWorkerGroup):
    """A learned reward model that scores whole sequences."""

    worker_cls = RewardModelWorker

    def init_model(self) -> None:
        self._call(RewardModelWorker.init_model)

    def compute_rm_score(self, data: DataProto) -> DataProto:
        """`rm_scores`: each sequence's score on its last valid response token."""
        return self._call(RewardModelWorker.compute_rm_score, data)


class SFTGroup(TypedWorkerGroup):
    """The SFT trainer's ranks (hybridrl/trainer/sft_trainer.py)."""

    worker_cls = SFTWorker

    def init_model(self, total_training_steps: int) -> list[dict[str, int]]:
        return self._call(SFTWorker.init_model, total_training_steps)

    def train_batch(self, data: DataProto) -> list[dict[str, float]]:
        """One optimizer step over the global batch; every rank returns the same all-reduced metrics."""
        return self._call(SFTWorker.train_batch, data)

    def eval_batch(self, data: DataProto) -> DataProto:
        return self._call(SFTWorker.eval_batch, data)

    def save_checkpoint(self, local_path: str, global_step: int, max_ckpt_to_keep: int | None = None,
                        hf_model: bool = False) -> list[str]:
        return self._call(SFTWorker.save_checkpoint, local_path, global_step, max_ckpt_to_keep, hf_model)

    def load_checkpoint(self, local_path: str) -> list[dict[str, Any]]:
        return self._call(SFTWorker.load_checkpoint, local_path)


def role_class(config: PPOTrainerConfig, role: str) -> ClassWithInitArgs:
    """The worker class (with its constructor arguments) of one role name of a pool."""
    if role == "critic":
        return ClassWithInitArgs(CriticWorker, config.critic)
    if role == "rm":
        return ClassWithInitArgs(RewardModelWorker, config.reward_model)
    return ClassWithInitArgs(ActorRolloutRefWorker, config.actor_rollout_ref, role)


@dataclass
class StartedPool:
    pool: Pool
    processes: WorkerGroup
    resource_pool: Any = None  # the Ray placement groups it holds

    def stop(self) -> None:
        self.processes.shutdown()
        if self.resource_pool is not None:
            self.resource_pool.remove()


def start_pool(pool: Pool, worker: ClassWithInitArgs, backend: str, device: str,
               cpus_per_process: float = 1.0) -> StartedPool:
    """One pool's processes, each running `worker` (if starting fails, what was reserved is freed)."""
    resource_pool = None
    if backend == "ray":
        from hybridrl.controller.ray import RayResourcePool

        resource_pool = RayResourcePool(pool.process_on_nodes, use_gpu=device == "cuda", name_prefix=pool.name,
                                        cpus_per_process=cpus_per_process)
    try:
        processes = create_worker_group(backend, worker, resource_pool, device=device)
    except BaseException:
        if resource_pool is not None:
            resource_pool.remove()
        raise
    if resource_pool is not None:
        print(resource_pool.placed())
    return StartedPool(pool, processes, resource_pool)


def check_cluster_holds(config: PPOTrainerConfig) -> None:
    """Fail naming every pool when the Ray cluster cannot hold them all at once (RayResourcePool sees only its own)."""
    import ray

    pools = placement(config)
    processes = sum(pool.world_size for pool in pools)
    cpus = processes * config.ray_init.cpus_per_worker
    have = ray.cluster_resources()
    sizes = ", ".join(f"{pool.name} {pool.nnodes} x {pool.processes_per_node}" for pool in pools)
    if cpus > have.get("CPU", 0.0):
        raise RuntimeError(
            f"the run's pools need {processes} processes x {config.ray_init.cpus_per_worker} CPU = {cpus} CPUs "
            f"({sizes}) but the Ray cluster has {have.get('CPU', 0.0):g}. Shrink the pools (trainer.*, rollout.*, "
            f"reward_model.* n_gpus_per_node / nnodes; on CPU they count processes) or give Ray more CPUs "
            f"(ray_init.num_cpus for a local cluster, ray start --num-cpus)")
    if config.trainer.device == "cuda" and processes > have.get("GPU", 0.0):
        raise RuntimeError(f"the run's pools need {processes} GPUs ({sizes}) but the Ray cluster has "
                           f"{have.get('GPU', 0.0):g}; shrink the pools or add GPUs")


@dataclass
class WorkerGroups:
    """The run's role handles. `actor_rollout` trains (and, colocated, generates); `rollout` generates: the same
    handle colocated, the rollout pool's when split, where `weight_sync` moves the actor's weights to it."""

    actor_rollout: ActorRolloutRefGroup
    critic: CriticGroup | None
    reward_model: RewardModelGroup | None
    uses_reference: bool
    world_size: int  # the training pool's ranks: the batch is balanced over them
    rollout: ActorRolloutRefGroup | None = None
    weight_sync: WeightSync | None = None
    pools: list[StartedPool] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.rollout is None:
            self.rollout = self.actor_rollout

    @classmethod
    def create(cls, config: PPOTrainerConfig) -> WorkerGroups:
        """Start every pool's ranks, initialise their models and, split, connect the weight sync (stopping what
        started if anything fails)."""
        if config.trainer.backend == "ray":
            check_cluster_holds(config)
        started: list[StartedPool] = []
        try:
            for pool in placement(config):
                roles = hybrid_worker({role: role_class(config, role) for role in pool.roles})
                started.append(start_pool(pool, roles, config.trainer.backend, config.trainer.device,
                                          config.ray_init.cpus_per_worker))
        except BaseException:
            for pool in started:
                pool.stop()
            raise
        kinds = {"critic": CriticGroup, "rm": RewardModelGroup}
        handles: dict[str, Any] = {role: kinds.get(role, ActorRolloutRefGroup)(entry.processes, role)
                                   for entry in started for role in entry.pool.roles}
        actor_name = started[0].pool.roles[0]
        created = cls(
            actor_rollout=handles[actor_name], critic=handles.get("critic"), reward_model=handles.get("rm"),
            uses_reference=uses_reference(config), world_size=started[0].processes.world_size,
            rollout=handles.get("rollout"), pools=started,
        )
        try:
            for group in created.roles():
                group.init_model()
            if is_split(config):
                arr = config.actor_rollout_ref
                created.weight_sync = WeightSync.connect(
                    created.actor_rollout, created.rollout,
                    arr.rollout.checkpoint_engine.update_weights_bucket_megabytes, arr.nccl_timeout)
        except BaseException:
            created.shutdown()
            raise
        return created

    @property
    def total_processes(self) -> int:
        return sum(entry.processes.world_size for entry in self.pools) or self.world_size

    def roles(self) -> list[ActorRolloutRefGroup | CriticGroup | RewardModelGroup]:
        handles = [self.actor_rollout, self.rollout, self.critic, self.reward_model]
        return [g for i, g in enumerate(handles) if g is not None and all(g is not h for h in handles[:i])]

    def sync_rollout_weights(self, version: int) -> dict[str, float]:
        """Split: move the actor's weights to the rollout pool as `version` (its metrics), unless it holds them."""
        if self.weight_sync is None or self.weight_sync.version == version:
            return {}
        return self.weight_sync.sync(version)

    def model_passes(self) -> dict[str, ModelPass]:
        """Every role's model passes (for MFU), each with the summed peak of the ranks that run it."""
        return {name: model_pass for group in self.roles()
                for name, model_pass in combine_ranks(group.model_passes()).items()}

    def process_memory(self) -> list[ProcessMemory]:
        """Peak memory of every worker process (colocated roles report the same process; callers dedupe)."""
        return [report for group in self.roles() for report in group.process_memory()]

    def shutdown(self) -> None:
        """Stop every pool's worker processes (Ray actors; the local rank's process group) and free its resources."""
        while self.pools:
            self.pools.pop().stop()
