"""Ranks on several hosts: the address each listens on (`socket_address`) and the check that every rank reaches
every rank on another address before gloo's mesh forms (`check_ranks_reach_each_other`, hybridrl/controller/worker.py).
Two loopback addresses (127.0.0.1 and 127.0.0.2) stand in for two hosts; tests/multinode runs real ones."""

import socket
import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from hybridrl.controller.worker import check_ranks_reach_each_other, interface_addresses, socket_address


def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))


def test_a_rank_listens_on_the_interface_that_holds_its_node_address():
    interfaces = interface_addresses()
    loopback = next(name for name, addresses in interfaces.items() if "127.0.0.1" in addresses)
    assert socket_address("127.0.0.1", interfaces, None) == ("127.0.0.1", loopback)
    # GLOO_SOCKET_IFNAME wins, and its interface's own address is the one the other ranks are told
    assert socket_address("10.0.0.9", interfaces, f"{loopback},other0") == ("127.0.0.1", loopback)


def test_an_interface_or_node_address_this_host_lacks_is_named():
    interfaces = interface_addresses()
    with pytest.raises(RuntimeError, match=r"GLOO_SOCKET_IFNAME=nosuch0 names no interface of this host; it has \["):
        socket_address("127.0.0.1", interfaces, "nosuch0")
    with pytest.raises(RuntimeError, match=r"node address 192\.0\.2\.7 is on no interface .* --node-ip-address"):
        socket_address("192.0.2.7", interfaces, None)


def test_ranks_on_two_addresses_that_reach_each_other_pass():
    host, errors = store(), []

    def rank(index: int, address: str) -> None:
        # each rank its own client, as each process has (one client's blocking get would hold the other's set)
        client = dist.TCPStore("127.0.0.1", host.port, is_master=False, timeout=timedelta(seconds=30))
        try:
            check_ranks_reach_each_other(client, index, 2, address, timeout_s=10)
        except Exception as err:  # noqa: BLE001 - reported to the test's thread
            errors.append(err)

    threads = [threading.Thread(target=rank, args=(i, f"127.0.0.{i + 1}")) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []


def test_a_rank_that_cannot_reach_another_fails_naming_both_addresses():
    shared = store()
    # rank 1 announces a port nobody listens on any more, as a rank behind a firewall that refuses would
    with socket.create_server(("127.0.0.2", 0)) as gone:
        port = gone.getsockname()[1]
    shared.set("hybridrl/reach/1", f"127.0.0.2|{port}")
    shared.set("hybridrl/reach/1/failures", "")
    with pytest.raises(RuntimeError, match=rf"rank 0 at 127\.0\.0\.1 cannot reach rank 1 at 127\.0\.0\.2:{port} "
                                           rf"\(.*refused.*GLOO_SOCKET_IFNAME"):
        check_ranks_reach_each_other(shared, 0, 2, "127.0.0.1", timeout_s=5)


def test_a_failure_one_rank_sees_stops_every_rank():
    shared = store()
    shared.set("hybridrl/reach/1", "127.0.0.2|1")
    shared.set("hybridrl/reach/1/failures", "rank 1 at 127.0.0.2 cannot reach rank 0 at 127.0.0.1:1 (refused)")
    # rank 1's report reaches rank 0, which stops naming it beside its own failure
    with pytest.raises(RuntimeError, match=r"rank 0 at 127\.0\.0\.1 cannot reach rank 1 .*; rank 1 at 127\.0\.0\.2 "
                                           r"cannot reach rank 0"):
        check_ranks_reach_each_other(shared, 0, 2, "127.0.0.1", timeout_s=2)
