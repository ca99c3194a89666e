"""What a Ray rank finds in its environment, checked without starting Ray."""

import pytest
from workers_for_tests import ScaleWorker

from hybridrl.controller import ClassWithInitArgs, create_worker_group
from hybridrl.controller.ray import RayResourcePool, rank_environment
from hybridrl.utils.device import DEVICE_ENV


def test_a_ranks_device_type_follows_the_pools_gpu_bundles():
    # trainer.device=cpu builds a CPU pool: its ranks compute on the CPU even where the node has GPUs
    cpu = rank_environment(RayResourcePool([2, 2]), 3, 1, 2, ("10.0.0.1", 1234), threads=2)
    assert cpu == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                   "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234", "HYBRIDRL_NUM_THREADS": "2",
                   "OMP_NUM_THREADS": "2", DEVICE_ENV: "cpu"}
    gpu = rank_environment(RayResourcePool([2], use_gpu=True), 1, 1, 2, ("10.0.0.1", 1234), threads=1)
    assert gpu[DEVICE_ENV] == "cuda" and gpu["LOCAL_RANK"] == "1"


def test_a_device_the_pool_cannot_serve_fails_before_any_actor_starts():
    with pytest.raises(ValueError, match="use_gpu=False"):
        create_worker_group("ray", ClassWithInitArgs(ScaleWorker, scale=1.0), RayResourcePool([1]), device="cuda")
