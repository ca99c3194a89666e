"""Split placement with two ranks on each side: the training pool's FSDP shards are gathered by both ranks, rank 0
alone sends, and both rollout ranks receive the updated weights (tests/trainer/test_split_placement.py compares
a 1 + 1 split run with colocated to the bit).

Four worker processes on a 2-core machine: this module starts its own Ray with 4 CPUs (`ray_init.num_cpus`),
oversubscribed, which changes the speed and not the results."""

import pytest
from ppo_helpers import ppo_config, tiny_run_overrides

from hybridrl.trainer.main_ppo import run_ppo

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_two_training_ranks_sync_two_rollout_ranks(arithmetic_data, tiny_model_dir, tmp_path):
    split = run_ppo(ppo_config(*tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "split"),
                               "trainer.n_gpus_per_node=2", "actor_rollout_ref.hybrid_engine=false",
                               "rollout.n_gpus_per_node=2", "actor_rollout_ref.rollout.calculate_log_probs=true",
                               "ray_init.num_cpus=4", "actor_rollout_ref.actor.optim.lr=1e-2",
                               "trainer.total_training_steps=2"))
    assert [m["rollout/weight_version"] for m in split] == [0, 1]
    # step 2's samples came from the weights of step 1's update, which moved the policy far past this gap from
    # the starting one (the KL to the reference): a rollout left on the old weights would be off by as much
    assert max(m["rollout/log_prob_diff_max"] for m in split) <= 1e-5
    assert split[1]["actor/kl_loss"] > 1e-4
