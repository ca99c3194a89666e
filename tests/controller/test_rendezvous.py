"""How a group's ranks meet: no port is picked ahead of the bind that takes it (`rank_store`, hybridrl/controller/worker.py)."""

import os
import random
import socket
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from workers_for_tests import ScaleWorker

from hybridrl.controller import ClassWithInitArgs, create_worker_group
from hybridrl.controller.worker import RENDEZVOUS_KEY_ENV, DistEnv, init_distributed, rank_store
from hybridrl.utils.device import device_env


def env(rank: int, world_size: int, port: int) -> DistEnv:
    return DistEnv(rank=rank, world_size=world_size, local_rank=rank, local_world_size=world_size,
                   master_addr="127.0.0.1", master_port=port)


def test_the_local_backend_binds_a_port_of_the_os_choosing(local_env, monkeypatch):
    monkeypatch.delenv("MASTER_PORT", raising=False)
    wg = create_worker_group("local", ClassWithInitArgs(ScaleWorker, scale=1.0))
    assert os.environ["MASTER_PORT"] == "0"  # nothing was chosen ahead
    assert wg.call("all_reduce_ranks") == [1.0]
    wg.shutdown()


def test_rank_zero_alone_hosts_a_store_on_the_port_it_bound():
    store = rank_store(env(0, 1, 0))
    assert store.port > 0
    # the port is bound for as long as the store lives: nobody else can take it
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("0.0.0.0", store.port))
    store.set("k", "v")
    assert store.get("k") == b"v"


def test_port_zero_anywhere_but_a_lone_or_announcing_rank_zero_is_refused(monkeypatch):
    monkeypatch.delenv(RENDEZVOUS_KEY_ENV, raising=False)
    with pytest.raises(RuntimeError, match="rank 1 was started with MASTER_PORT=0"):
        rank_store(env(1, 2, 0))
    with pytest.raises(RuntimeError, match=f"{RENDEZVOUS_KEY_ENV} is unset.*same MASTER_PORT"):
        rank_store(env(0, 2, 0))


def _join(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), **device_env("cpu"))
    init_distributed(DistEnv.from_environ())
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    Path(out_dir, str(rank)).write_text(str(value.item()))
    dist.destroy_process_group()


def test_a_port_given_outright_is_used_as_given():
    # as torchrun or a user's own launcher gives one; picked below the ephemeral range, where the OS never
    # hands out ports on its own, so no other test's sockets take it meanwhile
    for port in random.sample(range(20000, 32000), 50):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(_join, args=(port, out_dir), nprocs=2, join=True, start_method="spawn")
        assert [Path(out_dir, str(r)).read_text() for r in (0, 1)] == ["3.0", "3.0"]
