"""A rank that reserves k CPUs is given k torch threads (`ray_init.cpus_per_worker` in the trainer); the
fixed thread policy keeps them however busy the suite's other workers keep the cores."""

import pytest
import ray
import workers_for_tests
from workers_for_tests import ScaleWorker

from hybridrl.controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from hybridrl.utils.cpu_threads import POLICY_ENV

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_a_rank_with_two_cpus_uses_two_threads(ray_cluster, monkeypatch):
    monkeypatch.setenv(POLICY_ENV, "fixed")  # reaches the rank through rank_environment
    ray.cloudpickle.register_pickle_by_value(workers_for_tests)
    pool = RayResourcePool(process_on_nodes=[1], cpus_per_process=2)
    try:
        group = RayWorkerGroup(pool, RayClassWithInitArgs(ScaleWorker, scale=1.0))
        assert [i["num_threads"] for i in group.call("process_info")] == [2]
        group.shutdown()
    finally:
        pool.remove()
