"""PPO with the actor, reference and critic each split over a Ulysses group of two ranks trains as the
same run with two data-parallel ranks: the same samples, losses, gradient norms and values."""

import pytest
from ppo_helpers import ppo_config, tiny_run_overrides

from hybridrl.trainer.main_ppo import run_ppo

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

SAME = ["critic/score/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/kl_loss",
        "critic/vf_loss", "critic/grad_norm", "critic/values/mean", "response_length/mean"]


def test_ppo_with_sequence_parallel_groups_trains_as_data_parallel_ranks(arithmetic_data, tiny_model_dir, tmp_path):
    def run(name, *extra):
        base = tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / name)
        return run_ppo(ppo_config(*base, "algorithm.adv_estimator=gae", "trainer.backend=ray",
                                  "trainer.n_gpus_per_node=2", "trainer.total_training_steps=2",
                                  "critic.ppo_micro_batch_size_per_gpu=4", "critic.optim.lr=1e-3", *extra))

    data_parallel = run("dp")
    split = run("sp", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                "critic.ulysses_sequence_parallel_size=2")
    for dp_step, sp_step in zip(data_parallel, split, strict=True):
        for key in SAME:
            assert sp_step[key] == pytest.approx(dp_step[key], rel=1e-4, abs=1e-6), key
