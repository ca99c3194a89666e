"""The trainer's worker groups: which roles a run needs, where they live, and a typed handle per role.

All roles of a run share one pool of processes (`trainer.nnodes x trainer.n_gpus_per_node`): the actor,
rollout and reference policy are one role object; the critic and reward model, when present, are role
objects in the same processes, all held by one `HybridWorker` per rank. Each role is driven through
its typed handle (`TypedWorkerGroup`; docs/architecture.md, "Worker groups and dispatch").
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from hybridrl.algos import get_adv_estimator_spec
from hybridrl.controller import (
    ClassWithInitArgs,
    TypedWorkerGroup,
    WorkerGroup,
    create_worker_group,
    hybrid_worker,
)
from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo_config import PPOTrainerConfig
from hybridrl.utils.device import ProcessMemory
from hybridrl.utils.metric import ModelPass, combine_ranks
from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker
from hybridrl.workers.reward_model import RewardModelWorker
from hybridrl.workers.sft_worker import SFTWorker


class ActorRolloutRefGroup(TypedWorkerGroup):
    """Actor, rollout and (with a reference role) reference policy, on every rank of the pool."""

    worker_cls = ActorRolloutRefWorker

    def init_model(self) -> None:
        self._call(ActorRolloutRefWorker.init_model)

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """`rollout.n` responses per prompt, rows grouped by prompt (layout: hybridrl/workers/rollout/base.py)."""
        return self._call(ActorRolloutRefWorker.generate_sequences, prompts)

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
        self._call(ActorRolloutRefWorker.save_checkpoint, local_path, hdfs_path, global_step,
                        max_ckpt_to_keep)

    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None,
                        del_local_after_load: bool = False) -> None:
        self._call(ActorRolloutRefWorker.load_checkpoint, local_path, hdfs_path, del_local_after_load)


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


class Role(str, Enum):
    """verl's role names, used as keys of the colocated groups."""

    ActorRollout = "actor_rollout"
    ActorRolloutRef = "actor_rollout_ref"
    Critic = "critic"
    RewardModel = "rm"


def uses_reference(config: PPOTrainerConfig) -> bool:
    return config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss


def uses_critic(config: PPOTrainerConfig) -> bool:
    return get_adv_estimator_spec(config.algorithm.adv_estimator).needs_critic


def actor_role(config: PPOTrainerConfig) -> Role:
    """The actor's role: with the reference policy in the same processes when the run needs it."""
    return Role.ActorRolloutRef if uses_reference(config) else Role.ActorRollout


def role_classes(config: PPOTrainerConfig) -> dict[str, ClassWithInitArgs]:
    """The worker class (with its constructor arguments) of every role this run needs."""
    role = actor_role(config).value
    classes = {role: ClassWithInitArgs(ActorRolloutRefWorker, config.actor_rollout_ref, role)}
    if uses_critic(config):
        classes[Role.Critic.value] = ClassWithInitArgs(CriticWorker, config.critic)
    if config.reward_model.enable:
        classes[Role.RewardModel.value] = ClassWithInitArgs(RewardModelWorker, config.reward_model)
    return classes


@dataclass
class WorkerGroups:
    actor_rollout: ActorRolloutRefGroup
    critic: CriticGroup | None
    reward_model: RewardModelGroup | None
    uses_reference: bool
    world_size: int
    resource_pool: Any = None
    processes: WorkerGroup | None = None  # the HybridWorker group every role's handle drives: what `shutdown` stops

    @classmethod
    def create(cls, config: PPOTrainerConfig) -> WorkerGroups:
        """Start every role's ranks on the configured backend and initialise their models (if one fails, the
        ranks already started are stopped before the error propagates)."""
        classes = role_classes(config)
        backend = config.trainer.backend
        pool = None
        if backend == "ray":
            from hybridrl.controller.ray import RayResourcePool

            pool = RayResourcePool([config.trainer.n_gpus_per_node] * config.trainer.nnodes,
                                   use_gpu=config.trainer.device == "cuda", name_prefix="global_pool",
                                   cpus_per_process=config.ray_init.cpus_per_worker)
        try:
            processes = create_worker_group(backend, hybrid_worker(classes), pool, device=config.trainer.device)
        except BaseException:
            if pool is not None:
                pool.remove()
            raise
        actor_role_name = next(iter(classes))
        critic, reward_model = Role.Critic.value in classes, Role.RewardModel.value in classes
        created = cls(
            actor_rollout=ActorRolloutRefGroup(processes, actor_role_name),
            critic=CriticGroup(processes, Role.Critic.value) if critic else None,
            reward_model=RewardModelGroup(processes, Role.RewardModel.value) if reward_model else None,
            uses_reference=actor_role_name == Role.ActorRolloutRef.value,
            world_size=processes.world_size,
            resource_pool=pool,
            processes=processes,
        )
        try:
            for group in created.roles():
                group.init_model()
        except BaseException:
            created.shutdown()
            raise
        return created

    def roles(self) -> list[ActorRolloutRefGroup | CriticGroup | RewardModelGroup]:
        return [g for g in (self.actor_rollout, self.critic, self.reward_model) if g is not None]

    def model_passes(self) -> dict[str, ModelPass]:
        """Every role's model passes (for MFU), each with the summed peak of the ranks that run it."""
        passes: dict[str, ModelPass] = {}
        for group in self.roles():
            passes.update(combine_ranks(group.model_passes()))
        return passes

    def process_memory(self) -> list[ProcessMemory]:
        """Peak memory of every worker process (colocated roles report the same process; callers dedupe)."""
        return [report for group in self.roles() for report in group.process_memory()]

    def shutdown(self) -> None:
        """Stop the worker processes (Ray actors; the local rank's process group) and free the pool."""
        if self.processes is not None:
            self.processes.shutdown()
            self.processes = None
        if self.resource_pool is not None:
            self.resource_pool.remove()
            self.resource_pool = None
