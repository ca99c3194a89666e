"""Which worker groups a run needs, and where they live.

All roles of a run share one pool of processes (`trainer.nnodes x trainer.n_gpus_per_node`): the actor,
rollout and reference policy are one worker; the critic and reward model, when present, are colocated
in the same processes through a fused worker class. The backend (Ray or local) is one setting.
Each role's group is wrapped in its typed handle (hybridrl/trainer/role_groups.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from hybridrl.algos import get_adv_estimator_spec
from hybridrl.controller import (
    ClassWithInitArgs,
    WorkerGroup,
    create_colocated_worker_cls,
    create_worker_group,
)
from hybridrl.trainer.ppo_config import PPOTrainerConfig
from hybridrl.trainer.role_groups import ActorRolloutRefGroup, CriticGroup, RewardModelGroup
from hybridrl.utils.device import ProcessMemory
from hybridrl.utils.flops import ModelPass, combine_ranks
from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker
from hybridrl.workers.reward_model import RewardModelWorker


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
    processes: WorkerGroup | None = None  # the group all roles' views share: what `shutdown` stops

    @classmethod
    def create(cls, config: PPOTrainerConfig) -> WorkerGroups:
        """Start every role's ranks on the configured backend and initialise their models.

        If a model fails to initialise, the ranks already started are stopped before the error propagates.
        """
        classes = role_classes(config)
        backend = config.trainer.backend
        pool = None
        if backend == "ray":
            from hybridrl.controller.ray import RayResourcePool

            pool = RayResourcePool([config.trainer.n_gpus_per_node] * config.trainer.nnodes,
                                   use_gpu=config.trainer.device == "cuda", name_prefix="global_pool",
                                   cpus_per_process=config.ray_init.cpus_per_worker)
        try:
            processes = create_worker_group(backend, create_colocated_worker_cls(classes), pool,
                                            device=config.trainer.device)
        except BaseException:
            if pool is not None:
                pool.remove()
            raise
        views = processes.spawn(prefix_set=list(classes))
        actor_name = next(iter(classes))
        critic, reward_model = views.get(Role.Critic.value), views.get(Role.RewardModel.value)
        created = cls(
            actor_rollout=ActorRolloutRefGroup(views[actor_name]),
            critic=CriticGroup(critic) if critic is not None else None,
            reward_model=RewardModelGroup(reward_model) if reward_model is not None else None,
            uses_reference=actor_name == Role.ActorRolloutRef.value,
            world_size=views[actor_name].world_size,
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
