"""Batch-size settings, checked once per worker, and verl's global units turned into per-rank rows.

`ppo_mini_batch_size` counts prompts over all ranks, in the config and everywhere the config goes (as
in verl); a rank trains on `mini_batch_rows` = ppo_mini_batch_size x rollout.n / world_size rows per
optimizer step, a number that lives only in the `BatchingPlan`. The micro-batch keys are per rank
already (`*_per_gpu`); verl's older global ones are divided here. Doing the arithmetic once, with an
error that names the settings when it does not divide, keeps it out of the training loops.
"""

from __future__ import annotations

import dataclasses

from hybridrl.workers.config import ActorConfig, ActorRolloutRefConfig, CriticConfig, RefConfig
from hybridrl.workers.rollout.rollout_config import RolloutConfig
from hybridrl.workers.update_loop import BatchingPlan


def per_rank(total: int, world_size: int, what: str) -> int:
    if total % world_size:
        raise ValueError(f"{what} ({total}) must be divisible by the data-parallel size ({world_size})")
    return total // world_size


def _micro(per_gpu: int | None, global_size: int | None, world_size: int, prefix: str) -> int | None:
    """The per-rank micro-batch size from the per-GPU key, or from verl's older global key."""
    if per_gpu is not None:
        if per_gpu <= 0:
            raise ValueError(f"{prefix}_per_gpu must be positive, got {per_gpu}")
        return per_gpu
    if global_size is not None:
        return per_rank(global_size, world_size, prefix)
    return None


def mini_batch_rows(config: ActorConfig | CriticConfig, rollout_n: int, world_size: int, prefix: str) -> int:
    """Rows one rank trains on per optimizer step: ppo_mini_batch_size prompts x rollout_n samples, split
    over the data-parallel ranks."""
    return per_rank(config.ppo_mini_batch_size * rollout_n, world_size,
                    f"{prefix}.ppo_mini_batch_size ({config.ppo_mini_batch_size}) x rollout.n ({rollout_n})")


def normalize_actor_rollout_ref(config: ActorRolloutRefConfig, world_size: int) -> ActorRolloutRefConfig:
    """A checked copy whose micro-batch keys are per rank (ppo_mini_batch_size stays in prompts)."""
    n = config.rollout.n
    actor = config.actor
    if actor.rollout_n is not None and actor.rollout_n != n:
        raise ValueError(f"actor.rollout_n ({actor.rollout_n}) disagrees with rollout.n ({n}); "
                         f"leave actor.rollout_n unset, it follows rollout.n")
    mini_batch_rows(actor, n, world_size, "actor")
    actor = dataclasses.replace(
        actor,
        ppo_micro_batch_size_per_gpu=_micro(actor.ppo_micro_batch_size_per_gpu, actor.ppo_micro_batch_size,
                                            world_size, "actor.ppo_micro_batch_size"),
    )
    rollout = dataclasses.replace(
        config.rollout,
        log_prob_micro_batch_size_per_gpu=_micro(config.rollout.log_prob_micro_batch_size_per_gpu,
                                                 getattr(config.rollout, "log_prob_micro_batch_size", None),
                                                 world_size, "rollout.log_prob_micro_batch_size"),
    )
    ref = dataclasses.replace(
        config.ref,
        log_prob_micro_batch_size_per_gpu=_micro(config.ref.log_prob_micro_batch_size_per_gpu,
                                                 config.ref.log_prob_micro_batch_size, world_size,
                                                 "ref.log_prob_micro_batch_size"),
    )
    return dataclasses.replace(config, actor=actor, rollout=rollout, ref=ref)


def normalize_critic(config: CriticConfig, world_size: int) -> CriticConfig:
    """A checked copy whose micro-batch keys are per rank (ppo_mini_batch_size stays in prompts)."""
    if config.rollout_n is None:
        raise ValueError("critic.rollout_n is unset: set it to the samples per prompt (the PPO trainer fills it "
                         "in from actor_rollout_ref.rollout.n)")
    mini_batch_rows(config, config.rollout_n, world_size, "critic")
    return dataclasses.replace(
        config,
        ppo_micro_batch_size_per_gpu=_micro(config.ppo_micro_batch_size_per_gpu, config.ppo_micro_batch_size,
                                            world_size, "critic.ppo_micro_batch_size"),
        forward_micro_batch_size_per_gpu=_micro(config.forward_micro_batch_size_per_gpu,
                                                config.forward_micro_batch_size, world_size,
                                                "critic.forward_micro_batch_size"),
    )


def update_plan(config: ActorConfig | CriticConfig, rollout_n: int, world_size: int) -> BatchingPlan:
    """How a normalised actor or critic config cuts a rank's rows (fixed micro-batches or a token budget).

    Both configs carry verl's same update keys (ppo_mini_batch_size, ppo_micro_batch_size_per_gpu,
    use_dynamic_bsz, ppo_max_token_len_per_gpu, ppo_epochs, shuffle, data_loader_seed).
    """
    rows = mini_batch_rows(config, rollout_n, world_size, "critic" if isinstance(config, CriticConfig) else "actor")
    return BatchingPlan(
        mini_batch_rows=rows,
        micro_batch_rows=None if config.use_dynamic_bsz else (config.ppo_micro_batch_size_per_gpu or rows),
        max_token_len=config.ppo_max_token_len_per_gpu if config.use_dynamic_bsz else None,
        epochs=config.ppo_epochs,
        shuffle=config.shuffle,
        seed=config.data_loader_seed or 0,
    )


def forward_batching(use_dynamic_bsz: bool, micro_batch_rows: int | None,
                     max_token_len: int) -> tuple[int | None, int | None]:
    """(micro_batch_rows, max_token_len) for a no-grad forward pass (log-probs, values).

    Without a micro-batch size, a rank's whole share goes through in one pass (a budget of 2^31 tokens).
    """
    if use_dynamic_bsz:
        return None, max_token_len
    if micro_batch_rows is None:
        return None, 2**31
    return micro_batch_rows, None


def log_prob_batching(config: RolloutConfig | RefConfig) -> tuple[int | None, int | None]:
    """Forward batching of a rollout or ref config's log-prob keys."""
    return forward_batching(config.log_prob_use_dynamic_bsz, config.log_prob_micro_batch_size_per_gpu,
                            config.log_prob_max_token_len_per_gpu)
