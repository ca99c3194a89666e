"""The local backend runs the same worker class in the driver process, with the same results."""

import os

import pytest
from group_checks import (
    check_dp_compute_proto_keeps_order,
    check_futures_chain,
    check_k_outputs_per_row_with_padding,
    check_other_dispatch_modes,
)
from workers_for_tests import ScaleRole, ScaleWorker

from hybridrl.controller import (
    ClassWithInitArgs,
    LocalWorkerGroup,
    create_worker_group,
    hybrid_worker,
)


def test_local_group_matches_the_ray_behaviour(local_env, monkeypatch):
    wg = create_worker_group("local", ClassWithInitArgs(ScaleWorker, scale=2.0))
    assert isinstance(wg, LocalWorkerGroup) and wg.world_size == 1
    assert wg.call("all_reduce_ranks") == [1.0]
    check_dp_compute_proto_keeps_order(wg, scale=2.0)
    check_k_outputs_per_row_with_padding(wg)
    check_other_dispatch_modes(wg)
    check_futures_chain(wg, scale=2.0, monkeypatch=monkeypatch)
    assert wg.call("process_info")[0]["pid"] == os.getpid()


def test_local_hybrid_worker_roles(local_env):
    group = LocalWorkerGroup(hybrid_worker({
        "actor": ClassWithInitArgs(ScaleWorker, scale=2.0),
        "critic": ClassWithInitArgs(ScaleWorker, scale=3.0),
    }))
    assert group.roles == {"actor": ScaleWorker, "critic": ScaleWorker}
    check_dp_compute_proto_keeps_order(ScaleRole(group, "actor"), scale=2.0)
    check_dp_compute_proto_keeps_order(ScaleRole(group, "critic"), scale=3.0)
    with pytest.raises(KeyError, match=r"no role 'reward'.*\['actor', 'critic'\]"):
        group.call_role("reward", ScaleWorker.scale_rows)


def test_unknown_backend_names_the_setting():
    with pytest.raises(ValueError, match="trainer.backend"):
        create_worker_group("mpi", ClassWithInitArgs(ScaleWorker, scale=1.0))


class FailingWorker(ScaleWorker):
    def __init__(self) -> None:
        super().__init__(scale=1.0)  # joins the process group, then fails like a model that cannot load
        raise RuntimeError("no such model")


def test_shutdown_closes_the_process_group_and_restores_the_env(local_env, monkeypatch):
    import torch.distributed as dist

    from hybridrl.controller.worker_group import DIST_ENV_KEYS

    for key in DIST_ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "localhost")  # a value the user had set: kept, and put back as it was
    group = LocalWorkerGroup(hybrid_worker({"actor": ClassWithInitArgs(ScaleWorker, scale=2.0),
                                            "critic": ClassWithInitArgs(ScaleWorker, scale=3.0)}))
    assert dist.is_initialized() and os.environ["RANK"] == "0"
    group.shutdown()
    assert not dist.is_initialized()
    assert {k: os.environ.get(k) for k in DIST_ENV_KEYS} == {**dict.fromkeys(DIST_ENV_KEYS), "MASTER_ADDR": "localhost"}
    os.environ["RANK"] = "5"  # whatever happens next in the process ...
    group.shutdown()  # ... a second shutdown leaves alone
    assert os.environ.pop("RANK") == "5"

    # a second group in the same process starts afresh; one whose worker fails to build cleans up too
    with pytest.raises(RuntimeError, match="no such model"):
        create_worker_group("local", ClassWithInitArgs(FailingWorker))
    assert not dist.is_initialized() and "RANK" not in os.environ


def pretend_a_gpu(monkeypatch) -> None:
    """torch says a GPU is there (none is); touching it for real would raise, as CUDA does on a CPU build."""
    import torch

    def no_cuda(*args, **kwargs):
        raise AssertionError("a CPU rank touched CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", no_cuda)


@pytest.mark.parametrize("via", ["argument", "inherited"])
def test_device_cpu_on_a_gpu_machine_keeps_the_rank_on_the_cpu_and_gloo(local_env, monkeypatch, via):
    # trainer.device=cpu reaches the rank as the launcher's DEVICE_ENV; torch seeing a GPU changes nothing
    import torch
    import torch.distributed as dist

    from hybridrl.utils.device import DEVICE_ENV

    pretend_a_gpu(monkeypatch)
    if via == "argument":
        monkeypatch.delenv(DEVICE_ENV, raising=False)  # else: the CPU-pinned environment of a test rank
    wg = LocalWorkerGroup(ClassWithInitArgs(ScaleWorker, scale=2.0), device="cpu" if via == "argument" else None)
    try:
        (info,) = wg.call("process_info")
        assert (info["device"], info["backend"], dist.get_backend()) == ("cpu", "gloo", "gloo")
        assert wg.worker.device == torch.device("cpu")
        check_dp_compute_proto_keeps_order(wg, scale=2.0)
    finally:
        wg.shutdown()
    if via == "argument":
        assert DEVICE_ENV not in os.environ  # the group's device goes with it


def test_device_cuda_reaches_the_rank(local_env, monkeypatch):
    # no GPU here: the rank gets as far as asking for its CUDA device, which is what this checks
    import torch

    from hybridrl.utils.device import DEVICE_ENV

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: asked.append(index) or _stop())
    with pytest.raises(RuntimeError, match="stop here"):
        LocalWorkerGroup(ClassWithInitArgs(ScaleWorker, scale=2.0), device="cuda")
    assert asked == [torch.device("cuda", 0)]
    assert os.environ.get(DEVICE_ENV) == "cpu"  # the failed group put the test's own setting back


def _stop():
    raise RuntimeError("stop here")
