"""Split placement with two ranks on each side: the training pool's FSDP shards are gathered by both ranks, rank 0
alone sends, and both rollout ranks receive; the run trains the 2-process colocated run's policy to the bit.

Four worker processes on a 2-core machine: this module starts its own Ray with 4 CPUs (`ray_init.num_cpus`),
oversubscribed, which changes the speed and not the results."""

import pytest
from ppo_helpers import ppo_config, tiny_run_overrides
from test_ppo_e2e import DETERMINISTIC

from hybridrl.trainer.main_ppo import run_ppo

pytestmark = [pytest.mark.slow, pytest.mark.ray]

TWO = ["trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.calculate_log_probs=true", "ray_init.num_cpus=4",
       "trainer.total_training_steps=2"]


def test_two_training_ranks_sync_two_rollout_ranks(arithmetic_data, tiny_model_dir, tmp_path):
    split = run_ppo(ppo_config(*tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "split"), *TWO,
                               "actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=2"))
    colocated = run_ppo(ppo_config(*tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "colocated"),
                                   *TWO))
    assert [m["rollout/weight_version"] for m in split] == [0, 1]
    assert max(m["rollout/log_prob_diff_max"] for m in split) <= 1e-5
    # each rollout rank generates the chunk, with the seed, that the colocated rank of the same number does
    for key in DETERMINISTIC:
        assert [m[key] for m in split] == [m[key] for m in colocated], key
