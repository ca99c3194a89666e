"""PPO with the actor, reference and critic each split over a Ulysses group of two ranks trains as the
same run with two data-parallel ranks: the same samples, losses, gradient norms and values; and its
checkpoint resumes without the groups."""

import pytest
from ppo_helpers import ppo_config, tiny_run_overrides

from hybridrl.trainer.main_ppo import run_ppo

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

SAME = ["critic/score/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/kl_loss",
        "critic/vf_loss", "critic/grad_norm", "critic/values/mean", "response_length/mean"]
SEQUENCE_PARALLEL = ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                     "critic.ulysses_sequence_parallel_size=2"]


def test_ppo_with_sequence_parallel_groups_trains_as_data_parallel_ranks(arithmetic_data, tiny_model_dir, tmp_path):
    def run(name, steps, *extra):
        base = tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / name)
        return run_ppo(ppo_config(*base, "algorithm.adv_estimator=gae", "trainer.backend=ray",
                                  "trainer.n_gpus_per_node=2", f"trainer.total_training_steps={steps}",
                                  "trainer.save_freq=1", "critic.ppo_micro_batch_size_per_gpu=4",
                                  "critic.optim.lr=1e-3", *extra))

    data_parallel = run("dp", 2)
    split = run("sp", 1, *SEQUENCE_PARALLEL)  # mini-batches of 2 prompts: two optimizer steps per step
    resumed = run("sp", 2)  # the second step from the first's checkpoint, data-parallel
    assert [m["training/global_step"] for m in split + resumed] == [1, 2]
    for dp_step, step in zip(data_parallel, split + resumed, strict=True):
        for key in SAME:
            assert step[key] == pytest.approx(dp_step[key], rel=1e-4, abs=1e-6), key
