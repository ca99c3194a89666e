"""Node groups of a Ray pool (`process_on_nodes`) and the nodes they land on. On a cluster of several hosts each
group takes a host of its own (tests/multinode); on this one-node cluster they share it, with a warning."""

import os

import pytest
import ray
import workers_for_tests
from workers_for_tests import ScaleWorker

from hybridrl.controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from hybridrl.controller.worker import bind_sockets_to_node_address, interface_addresses

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def ray_cluster(ray_cluster):
    # Test helper modules are not importable in Ray's worker processes; ship them by value.
    ray.cloudpickle.register_pickle_by_value(workers_for_tests)


def test_two_node_groups_on_a_one_node_cluster_share_it_with_a_warning(ray_cluster):
    pool = RayResourcePool(process_on_nodes=[1, 1], name_prefix="two_groups")
    with pytest.warns(UserWarning, match=r"asks for 2 nodes of 1 processes but the Ray cluster has 1 node\(s\)"):
        wg = RayWorkerGroup(pool, RayClassWithInitArgs(ScaleWorker, scale=1.0))
    try:
        node = ray.util.get_node_ip_address()
        assert pool.node_addresses == [node, node]
        assert wg.describe_rank(1) == f"rank 1 of pool 'two_groups' on node {node}"
        assert [info["node"] for info in wg.call("process_info")] == [node, node]
        assert wg.call("all_reduce_ranks") == [1.0 + 2.0] * 2  # one process group across the node groups
        # each rank bound gloo/NCCL to the interface of its node's address, in its own process only
        holder = next(name for name, addresses in interface_addresses().items() if node in addresses)
        env = wg.call("read_env", ["GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"])
        assert env == [{"GLOO_SOCKET_IFNAME": holder, "NCCL_SOCKET_IFNAME": holder}] * 2
        # the driver is no rank of a Ray group: its environment, which every rank it starts inherits, stays as it was
        assert bind_sockets_to_node_address() is None and "GLOO_SOCKET_IFNAME" not in os.environ
    finally:
        wg.shutdown()
        pool.remove()
