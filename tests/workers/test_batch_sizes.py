"""Batch-size normalisation of the worker configs (prompts -> rows per rank)."""

import dataclasses

import pytest

from hybridrl.workers.config import ActorConfig, ActorRolloutRefConfig
from hybridrl.workers.update_loop import normalize_actor_rollout_ref, update_plan


def config(actor_rollout_n):
    base = ActorRolloutRefConfig(actor=ActorConfig(ppo_mini_batch_size=4, rollout_n=actor_rollout_n))
    return dataclasses.replace(base, rollout=dataclasses.replace(base.rollout, n=2))


def test_actor_rollout_n_follows_rollout_n_or_must_equal_it():
    # 4 prompts x 2 samples = 8 rows per mini-batch, over 2 ranks: 4 rows each
    for follows in (None, 2):
        normalized = normalize_actor_rollout_ref(config(follows), world_size=2)
        assert normalized.actor.ppo_mini_batch_size == 4  # still prompts: verl's meaning of the key
        assert update_plan(normalized.actor, normalized.rollout.n, world_size=2).mini_batch_rows == 4
    with pytest.raises(ValueError, match=r"actor.rollout_n \(3\) disagrees with rollout.n \(2\)"):
        normalize_actor_rollout_ref(config(3), world_size=2)
