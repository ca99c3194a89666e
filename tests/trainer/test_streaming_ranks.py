"""Streaming with two rollout processes: each decodes its own continuous batch, the driver spreads prompts over
them by their load, and every step still trains its prompts once.

Three worker processes on a 2-core machine: this module starts its own Ray with 3 CPUs (`ray_init.num_cpus`),
oversubscribed, which changes the speed and not the results."""

import pytest
from ppo_helpers import ppo_config, tiny_run_overrides
from test_streaming import STREAMING, _trained_prompts

from hybridrl.trainer.async_training import StreamSettings
from hybridrl.trainer.main_ppo import run_ppo

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_two_rollout_processes_each_decode_their_own_continuous_batch(arithmetic_data, tiny_model_dir, tmp_path):
    base = tiny_run_overrides(arithmetic_data, tiny_model_dir, tmp_path / "run")
    two = [o.replace("rollout.n_gpus_per_node=1", "rollout.n_gpus_per_node=2") for o in STREAMING]
    history = run_ppo(ppo_config(*base, *two, "ray_init.num_cpus=3", "trainer.total_training_steps=3",
                                 "async_training.partial_rollout=true", "async_training.staleness_threshold=0.5",
                                 f"trainer.rollout_data_dir={tmp_path / 'run' / 'rollouts'}"))
    assert [m["training/global_step"] for m in history] == [1, 2, 3]
    bound = StreamSettings(4, 1, 0.5, True, 4, 2).max_staleness
    assert all(m["async/staleness_max"] <= bound for m in history)
    trained = _trained_prompts(tmp_path / "run")
    epoch = [p for step in sorted(trained) for p in trained[step]]
    assert len(epoch) == 12 and len(set(epoch)) == 12
