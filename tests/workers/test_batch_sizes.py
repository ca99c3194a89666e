"""Batch sizes of the worker configs: prompts -> rows per rank, computed from the config, never written back."""

import dataclasses

import pytest

from hybridrl.workers.config import ActorConfig, ActorRolloutRefConfig
from hybridrl.workers.update_loop import check_actor_rollout_ref, update_plan


def config(actor_rollout_n):
    base = ActorRolloutRefConfig(actor=ActorConfig(ppo_mini_batch_size=4, rollout_n=actor_rollout_n))
    return dataclasses.replace(base, rollout=dataclasses.replace(base.rollout, n=2))


def test_actor_rollout_n_follows_rollout_n_or_must_equal_it():
    # 4 prompts x 2 samples = 8 rows per mini-batch, over 2 ranks: 4 rows each
    for follows in (None, 2):
        built = config(follows)
        check_actor_rollout_ref(built, world_size=2)
        assert built.actor.ppo_mini_batch_size == 4  # still prompts: verl's meaning of the key
        assert update_plan(built.actor, built.rollout.n, world_size=2).mini_batch_rows == 4
    with pytest.raises(ValueError, match=r"actor.rollout_n \(3\) disagrees with actor_rollout_ref.rollout.n \(2\)"):
        check_actor_rollout_ref(config(3), world_size=2)


def test_the_global_micro_batch_key_is_divided_over_the_ranks_without_changing_the_config():
    built = config(None)
    built.actor.ppo_micro_batch_size = 4
    assert update_plan(built.actor, 2, world_size=2).micro_batch_rows == 2
    assert built.actor.ppo_micro_batch_size_per_gpu is None
    with pytest.raises(ValueError, match=r"actor_rollout_ref.actor.ppo_micro_batch_size \(4\) must be divisible"):
        check_actor_rollout_ref(built, world_size=8)
