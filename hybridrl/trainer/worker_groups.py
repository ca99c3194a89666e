"""Which worker groups a run needs, and where they live.

All roles of a run share one pool of processes (`trainer.nnodes x trainer.n_gpus_per_node`): the actor,
rollout and reference policy are one worker; the critic and reward model, when present, are colocated
in the same processes through a fused worker class. The backend (Ray or local) is one setting.
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


def role_classes(config: PPOTrainerConfig) -> dict[str, ClassWithInitArgs]:
    """The worker class (with its constructor arguments) of every role this run needs."""
    actor_role = Role.ActorRolloutRef if uses_reference(config) else Role.ActorRollout
    classes = {actor_role.value: ClassWithInitArgs(ActorRolloutRefWorker, config.actor_rollout_ref, actor_role.value)}
    if uses_critic(config):
        classes[Role.Critic.value] = ClassWithInitArgs(CriticWorker, config.critic)
    if config.reward_model.enable:
        classes[Role.RewardModel.value] = ClassWithInitArgs(RewardModelWorker, config.reward_model)
    return classes


@dataclass
class WorkerGroups:
    actor_rollout: WorkerGroup
    critic: WorkerGroup | None
    reward_model: WorkerGroup | None
    uses_reference: bool
    world_size: int
    resource_pool: Any = None

    @classmethod
    def create(cls, config: PPOTrainerConfig) -> WorkerGroups:
        """Start every role's ranks on the configured backend and initialise their models."""
        classes = role_classes(config)
        backend = config.trainer.backend
        pool = None
        if backend == "ray":
            from hybridrl.controller.ray_resources import RayResourcePool

            pool = RayResourcePool([config.trainer.n_gpus_per_node] * config.trainer.nnodes,
                                   use_gpu=config.trainer.device == "cuda", name_prefix="global_pool",
                                   cpus_per_process=config.ray_init.cpus_per_worker)
        fused = create_colocated_worker_cls(classes)
        groups = create_worker_group(backend, fused, pool).spawn(prefix_set=list(classes))
        actor_role = next(iter(classes))
        for group in groups.values():
            group.init_model()
        return cls(
            actor_rollout=groups[actor_role],
            critic=groups.get(Role.Critic.value),
            reward_model=groups.get(Role.RewardModel.value),
            uses_reference=actor_role == Role.ActorRolloutRef.value,
            world_size=groups[actor_role].world_size,
            resource_pool=pool,
        )
