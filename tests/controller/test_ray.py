"""The Ray backend: real actors, a real gloo process group, placement groups and colocation."""

import time

import pytest
import ray
import workers_for_tests
from group_checks import (
    check_dp_compute_proto_keeps_order,
    check_futures_chain,
    check_k_outputs_per_row_with_padding,
    check_other_dispatch_modes,
)
from ray.experimental.internal_kv import _internal_kv_get
from workers_for_tests import FailsOnRankZero, ScaleRole, ScaleWorker

from hybridrl.controller import hybrid_worker
from hybridrl.controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
)
from hybridrl.controller.worker import RENDEZVOUS_KEY_ENV

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def ray_cluster(ray_cluster):
    # Test helper modules are not importable in Ray's worker processes; ship them by value.
    ray.cloudpickle.register_pickle_by_value(workers_for_tests)


@pytest.fixture(scope="module")
def pool(ray_cluster):
    pool = RayResourcePool(process_on_nodes=[2])
    yield pool
    pool.remove()


@pytest.fixture(scope="module")
def group(pool):
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(ScaleWorker, scale=2.0))
    yield wg
    wg.shutdown()


def test_two_ranks_form_a_gloo_process_group(group):
    assert group.world_size == 2
    assert group.call("all_reduce_ranks") == [3.0, 3.0]  # (0 + 1) + (1 + 1) on both ranks
    infos = group.call("process_info")
    assert [i["rank"] for i in infos] == [0, 1]
    assert len({i["pid"] for i in infos}) == 2
    assert all(i["num_threads"] == 1 for i in infos)  # one CPU per rank -> one intra-op thread
    # a CPU pool's ranks compute on the CPU over gloo, whatever GPUs the node has (the launcher says so)
    assert all(i["device"] == "cpu" and i["backend"] == "gloo" for i in infos)


def test_dp_compute_proto_on_seven_rows_returns_seven_in_order(group):
    check_dp_compute_proto_keeps_order(group, scale=2.0)
    check_k_outputs_per_row_with_padding(group)


def test_other_dispatch_modes(group):
    check_other_dispatch_modes(group)


def test_futures_chain_without_the_driver(group, monkeypatch):
    check_futures_chain(group, scale=2.0, monkeypatch=monkeypatch)


def test_colocated_roles_share_processes(pool, group):
    group.shutdown()  # free the pool's bundles for the fused group
    wg = RayWorkerGroup(pool, hybrid_worker({
        "actor": RayClassWithInitArgs(ScaleWorker, scale=2.0),
        "critic": RayClassWithInitArgs(ScaleWorker, scale=3.0),
    }))
    actor, critic = ScaleRole(wg, "actor"), ScaleRole(wg, "critic")
    actor_pids = [i["pid"] for i in actor.process_info()]
    critic_pids = [i["pid"] for i in critic.process_info()]
    assert actor_pids == critic_pids and len(set(actor_pids)) == 2
    check_dp_compute_proto_keeps_order(actor, scale=2.0)
    check_dp_compute_proto_keeps_order(critic, scale=3.0)
    wg.shutdown()


def test_rank_zero_binds_its_own_port_and_the_others_learn_it(pool, group):
    group.shutdown()  # free the pool's bundles
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(ScaleWorker, scale=1.0))
    try:
        env = wg.call("read_env", ["MASTER_ADDR", "MASTER_PORT", RENDEZVOUS_KEY_ENV])
        # no rank was given a port: rank 0 bound one of the OS's choosing and announced it under the group's
        # key, where rank 1, started at the same time, read it
        assert env[0]["MASTER_PORT"] == env[1]["MASTER_PORT"] == "0"
        assert env[0][RENDEZVOUS_KEY_ENV] and env[1][RENDEZVOUS_KEY_ENV] == env[0][RENDEZVOUS_KEY_ENV]
        assert wg.call("all_reduce_ranks") == [3.0, 3.0]
    finally:
        wg.shutdown()
    assert _internal_kv_get(env[0][RENDEZVOUS_KEY_ENV]) is None  # the group took its announcement away


def test_a_rank_started_alongside_rank_zero_waits_for_its_announcement(ray_cluster, monkeypatch):
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_put

    from hybridrl.controller.worker import DistEnv, await_master

    def env(rank: int, world_size: int, port: int) -> DistEnv:
        return DistEnv(rank=rank, world_size=world_size, local_rank=rank, local_world_size=world_size,
                       master_addr="127.0.0.1", master_port=port)

    key = "hybridrl/rendezvous/test/await_master"
    monkeypatch.setenv(RENDEZVOUS_KEY_ENV, key)
    with pytest.raises(TimeoutError, match="rank 1: rank 0 did not announce"):
        await_master(env(1, 2, 0), timeout_s=0.1)
    _internal_kv_put(key, b"10.1.2.3:4567", overwrite=True)
    try:
        assert await_master(env(1, 2, 0)) == DistEnv(
            rank=1, world_size=2, local_rank=1, local_world_size=2, master_addr="10.1.2.3", master_port=4567)
        assert await_master(env(0, 2, 0)) == env(0, 2, 0)  # rank 0 binds; it waits for nobody
        assert await_master(env(1, 2, 29500)) == env(1, 2, 29500)  # a port given outright is used as given
    finally:
        _internal_kv_del(key)


def test_rank_zero_failing_before_it_binds_raises_its_error(pool, group):
    group.shutdown()
    start = time.monotonic()
    with pytest.raises(Exception, match="no such model"):
        RayWorkerGroup(pool, RayClassWithInitArgs(FailsOnRankZero))
    assert time.monotonic() - start < 60  # its error, not a wait for an address that never comes
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(ScaleWorker, scale=1.0))  # the pool's bundles are free again
    assert wg.call("all_reduce_ranks") == [3.0, 3.0]
    wg.shutdown()


def test_unsatisfiable_pool_fails_fast_naming_the_setting(ray_cluster):
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"n_gpus_per_node.*|has 2") as err:
        RayResourcePool(process_on_nodes=[3]).get_placement_groups()
    assert "has 2" in str(err.value) and "trainer.n_gpus_per_node" in str(err.value)
    assert time.monotonic() - start < 30  # a generous bound: the point is "no silent hang"
    with pytest.raises(RuntimeError, match="GPUs"):
        RayResourcePool(process_on_nodes=[1], use_gpu=True).get_placement_groups()


def test_torch_config_modules_pickle_by_name_after_the_fix():
    import pickle

    import torch.distributed.config as dist_config

    from hybridrl.controller.ray import register_torch_module_reducers

    register_torch_module_reducers()
    # Without the reducer cloudpickle raises "cannot pickle 'ConfigModuleInstance' object".
    assert pickle.loads(ray.cloudpickle.dumps(dist_config)) is dist_config
