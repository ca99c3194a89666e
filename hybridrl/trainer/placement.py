"""Where a run's roles live: its pools of processes and the roles each one holds (docs/placement.md).

Colocated (`actor_rollout_ref.hybrid_engine=true`): one pool holds every role. Split: a rollout pool of its own
receives the actor's weights after every update; `reward_model.enable_resource_pool=true` gives the reward model one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridrl.algos import get_adv_estimator_spec
from hybridrl.trainer.ppo_config import AsyncTrainingConfig, PPOTrainerConfig
from hybridrl.utils.device import device_setting_problem, resolve_device_type
from hybridrl.utils.typed_config import require


@dataclass(frozen=True)
class Pool:
    """`nnodes` nodes of `processes_per_node` worker processes, each holding the roles named."""

    name: str
    nnodes: int
    processes_per_node: int
    roles: tuple[str, ...]

    @property
    def world_size(self) -> int:
        return self.nnodes * self.processes_per_node

    @property
    def process_on_nodes(self) -> list[int]:
        return [self.processes_per_node] * self.nnodes


def check_backend(trainer: Any) -> None:
    """Any entry point's `trainer.backend` and its pool of trainer.nnodes x n_gpus_per_node ranks; resolves
    `trainer.device` in place."""
    ranks = trainer.nnodes * trainer.n_gpus_per_node
    require(trainer.backend in ("ray", "local"), f"trainer.backend must be ray or local, got {trainer.backend!r}")
    require(ranks >= 1, f"trainer.nnodes x trainer.n_gpus_per_node = {ranks} must be positive")
    require(trainer.backend == "ray" or ranks == 1,
            f"trainer.backend=local needs trainer.nnodes x trainer.n_gpus_per_node = {ranks} to be 1 (local runs "
            f"one rank in this process): set trainer.nnodes=1 trainer.n_gpus_per_node=1 or use trainer.backend=ray")
    trainer.device = resolve_device_type(trainer.device)
    problem = device_setting_problem(trainer.device)
    require(problem is None, problem)


def uses_reference(config: PPOTrainerConfig) -> bool:
    return config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss


def uses_critic(config: PPOTrainerConfig) -> bool:
    return get_adv_estimator_spec(config.algorithm.adv_estimator).needs_critic


def is_split(config: PPOTrainerConfig) -> bool:
    """True when the rollout has a pool of its own."""
    return not config.actor_rollout_ref.hybrid_engine


def actor_role_name(config: PPOTrainerConfig) -> str:
    """The actor's role (fsdp_workers.py): with the rollout unless it has its own pool, with the reference if used."""
    ref = "_ref" if uses_reference(config) else ""
    return f"actor{ref}" if is_split(config) else f"actor_rollout{ref}"


def placement(config: PPOTrainerConfig) -> list[Pool]:
    """The run's pools, the training pool first."""
    t, rm = config.trainer, config.reward_model.enable
    own_rm_pool = rm and config.reward_model.enable_resource_pool
    training = [actor_role_name(config)] + ["critic"] * uses_critic(config) + ["rm"] * (rm and not own_rm_pool)
    pools = [Pool("global_pool", t.nnodes, t.n_gpus_per_node, tuple(training))]
    if is_split(config):
        pools.append(Pool("rollout_pool", config.rollout.nnodes, config.rollout.n_gpus_per_node, ("rollout",)))
    if own_rm_pool:
        pools.append(Pool("reward_pool", config.reward_model.nnodes, config.reward_model.n_gpus_per_node, ("rm",)))
    return pools


def placement_errors(config: PPOTrainerConfig) -> list[str]:
    """What the pool keys ask that cannot run, each naming the key and the fix."""
    errors = []
    t, rm, rollout = config.trainer, config.reward_model, config.rollout
    if is_split(config):
        if rollout.n_gpus_per_node < 1:
            errors.append("actor_rollout_ref.hybrid_engine=false gives the rollout a pool of its own, but "
                          "rollout.n_gpus_per_node=0: set rollout.n_gpus_per_node (processes per node; GPUs on a "
                          "GPU machine) and rollout.nnodes")
    elif rollout.n_gpus_per_node > 0:
        errors.append(f"rollout.n_gpus_per_node={rollout.n_gpus_per_node} sizes a rollout pool of its own, but "
                      f"actor_rollout_ref.hybrid_engine=true runs the rollout in the training processes: set "
                      f"actor_rollout_ref.hybrid_engine=false, or remove rollout.n_gpus_per_node")
    if rm.enable_resource_pool and not rm.enable:
        errors.append("reward_model.enable_resource_pool=true without reward_model.enable=true: there is no reward "
                      "model to place; enable it or remove enable_resource_pool")
    if rm.enable and rm.enable_resource_pool and (rm.nnodes < 1 or rm.n_gpus_per_node < 1):
        errors.append(f"reward_model.enable_resource_pool=true needs a pool: reward_model.nnodes={rm.nnodes} and "
                      f"reward_model.n_gpus_per_node={rm.n_gpus_per_node} must both be >= 1")
    mode = config.async_training.mode
    if mode in ("one_step_off", "streaming"):
        if not is_split(config):
            errors.append(f"async_training.mode={mode} generates while the training pool trains, which "
                          "needs a rollout pool of its own: set actor_rollout_ref.hybrid_engine=false and "
                          "rollout.n_gpus_per_node (with trainer.n_gpus_per_node for the training pool)")
        if mode == "one_step_off" and rm.enable and not rm.enable_resource_pool:
            errors.append("async_training.mode=one_step_off scores the next batch while the training pool trains, "
                          "so a reward model cannot share the training pool: set reward_model.enable_resource_pool="
                          "true with reward_model.n_gpus_per_node, or async_training.mode=sync")
    if mode == "streaming":
        if config.actor_rollout_ref.rollout.name != "hf":
            errors.append(f"async_training.mode=streaming decodes with the HF engine's continuous batch: set "
                          f"actor_rollout_ref.rollout.name=hf (not {config.actor_rollout_ref.rollout.name}), or "
                          f"async_training.mode=one_step_off")
        if config.actor_rollout_ref.rollout.multi_turn.enable:
            errors.append("async_training.mode=streaming samples single turns: set actor_rollout_ref.rollout."
                          "multi_turn.enable=false, or async_training.mode=one_step_off")
        if config.algorithm.filter_groups.enable:
            errors.append("async_training.mode=streaming trains prompts as they finish and does not refill a step "
                          "with varied groups: set algorithm.filter_groups.enable=false, or async_training.mode="
                          "one_step_off")
        if "reward_baselines" in get_adv_estimator_spec(config.algorithm.adv_estimator).required_inputs:
            errors.append(f"algorithm.adv_estimator={config.algorithm.adv_estimator} needs a greedy baseline "
                          f"generated with each batch, which streaming does not generate: use "
                          f"async_training.mode=one_step_off or sync")
    else:
        defaults = AsyncTrainingConfig()
        for key in ("staleness_threshold", "trigger_parameter_sync_step", "require_batches", "partial_rollout"):
            if getattr(config.async_training, key) != getattr(defaults, key):
                errors.append(f"async_training.{key} is a streaming setting, but async_training.mode={mode}: set "
                              f"async_training.mode=streaming, or remove async_training.{key}")
        for key in ("total_rollout_steps", "total_epochs", "test_freq"):
            if getattr(config.rollout, key) is not None:
                errors.append(f"rollout.{key} is verl's fully_async setting, read in streaming only, but "
                              f"async_training.mode={mode}: set async_training.mode=streaming, or use "
                              f"trainer.total_training_steps / total_epochs / test_freq")
    if t.backend == "local" and len(placement(config)) > 1:
        pools = ", ".join(p.name for p in placement(config)[1:])
        errors.append(f"trainer.backend=local runs one rank in this process, so it cannot start the pools of their "
                      f"own this run asks for ({pools}): use trainer.backend=ray, or set "
                      f"actor_rollout_ref.hybrid_engine=true and reward_model.enable_resource_pool=false")
    return errors


def describe(config: PPOTrainerConfig) -> str:
    """Every pool, its processes and its roles, for a dry run."""
    t = config.trainer
    if not is_split(config):
        layout = "colocated"
    elif config.async_training.mode == "one_step_off":
        layout = "split, one step off: the rollout generates the next batch with the weights of the step before"
    elif config.async_training.mode == "streaming":
        layout = "split, streaming: the rollout decodes without pause; steps train the groups that finish first"
    else:
        layout = "split: the rollout receives the actor weights after every update"
    lines = [f"placement: backend={t.backend}, device={t.device}, {layout}"]
    for pool in placement(config):
        lines.append(f"  {pool.name:<12} {pool.nnodes} node(s) x {pool.processes_per_node} process(es) = "
                     f"{pool.world_size}; roles: {', '.join(pool.roles)}")
    return "\n".join(lines)
