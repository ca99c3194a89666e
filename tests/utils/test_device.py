"""The one owner of a process's device: how trainer.device resolves, what a worker reads, which CUDA index."""

import os

import pytest
import torch

from hybridrl.utils import device
from hybridrl.utils.device import (
    DEVICE_ENV,
    cuda_index,
    device_env,
    device_type,
    distributed_backend,
    local_device,
    pinned,
    resolve_device_type,
)


def gpus(monkeypatch, count: int) -> None:
    """Pretend torch sees `count` CUDA devices (no GPU here: only the answers torch gives change)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize(("count", "expected"), [(0, "cpu"), (1, "cuda"), (8, "cuda")])
def test_auto_is_cuda_exactly_where_torch_sees_a_gpu(monkeypatch, count, expected):
    gpus(monkeypatch, count)
    assert resolve_device_type("auto") == expected
    assert resolve_device_type("cpu") == "cpu" and resolve_device_type("cuda") == "cuda"  # named: as named


def test_a_process_reads_the_device_its_launcher_set_and_falls_back_to_auto(monkeypatch):
    gpus(monkeypatch, 1)
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert device_type() == "cpu"  # trainer.device=cpu on a GPU machine: the CPU
    assert local_device() == torch.device("cpu") and distributed_backend() == "gloo"
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    assert device_type() == "cuda" and distributed_backend() == "cpu:gloo,cuda:nccl"
    monkeypatch.delenv(DEVICE_ENV)  # no launcher (a script building engines itself): cuda when present
    assert device_type() == "cuda"
    gpus(monkeypatch, 0)
    assert device_type() == "cpu" and distributed_backend() == "gloo"


def test_an_unknown_device_in_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "tpu")
    with pytest.raises(RuntimeError, match=DEVICE_ENV):
        device_type()
    with pytest.raises(ValueError, match="tpu"):
        device_env("tpu")
    with pytest.raises(ValueError, match="auto"):
        device_env("auto")  # a launcher hands over a resolved type, never auto


def test_one_visible_gpu_is_every_local_ranks_index_zero(monkeypatch):
    # Ray narrows CUDA_VISIBLE_DEVICES: the actor of local rank 3 sees its GPU as cuda:0
    gpus(monkeypatch, 1)
    assert [cuda_index(rank) for rank in range(4)] == [0, 0, 0, 0]


def test_several_visible_gpus_are_indexed_by_local_rank(monkeypatch):
    # the local backend (local rank 0) and torchrun-style launchers leave all of the node's GPUs visible
    gpus(monkeypatch, 4)
    assert [cuda_index(rank) for rank in range(4)] == [0, 1, 2, 3]
    with pytest.raises(RuntimeError, match="local rank 4 has no GPU of its own: this process sees 4"):
        cuda_index(4)


def test_cuda_without_a_visible_gpu_says_so(monkeypatch):
    gpus(monkeypatch, 0)
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    with pytest.raises(RuntimeError, match="torch sees no GPU"):
        local_device(0)


def test_the_rank_device_follows_the_rule_and_local_rank(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    monkeypatch.setenv("LOCAL_RANK", "3")
    gpus(monkeypatch, 1)
    assert local_device() == torch.device("cuda", 0)  # a Ray actor of local rank 3
    gpus(monkeypatch, 8)
    assert local_device() == torch.device("cuda", 3) == local_device(3)
    monkeypatch.delenv("LOCAL_RANK")
    assert local_device() == torch.device("cuda", 0)  # no launcher set LOCAL_RANK: the only rank


def test_pinned_sets_the_process_device_and_puts_the_old_one_back(monkeypatch):
    gpus(monkeypatch, 1)
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    with pinned("cpu"):
        assert device_type() == "cpu"
        with pinned("auto"):
            assert os.environ[DEVICE_ENV] == "cuda"
        assert device_type() == "cpu"
    assert DEVICE_ENV not in os.environ


def test_every_module_asks_the_owner_instead_of_torch():
    """No other module of the package decides cpu-or-cuda from torch.cuda.is_available() itself."""
    from pathlib import Path

    package = Path(device.__file__).resolve().parents[1]
    # These ask about cuda once it is named, never to choose it: the config checks, whether a GPU is
    # there when a user sets trainer.device=cuda; device.py itself, whether a cuda device multiplies bf16.
    allowed = {"utils/device.py", "trainer/config_checks.py", "trainer/main_generation.py"}
    deciders = [str(path.relative_to(package)) for path in package.rglob("*.py")
                if "torch.cuda.is_available()" in path.read_text()
                and str(path.relative_to(package)) not in allowed]
    assert deciders == []


def test_a_gpu_id_maps_to_its_place_among_the_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert device.visible_index("3") == 3  # every GPU visible: torch's index is the node's id
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4, 6,7")
    assert [device.visible_index(i) for i in ("4", "6", "7")] == [0, 1, 2]
    with pytest.raises(RuntimeError, match="GPU 5, which CUDA_VISIBLE_DEVICES='4, 6,7' hides"):
        device.visible_index("5")


def test_a_process_that_is_no_ray_actor_has_no_assigned_gpu(monkeypatch):
    monkeypatch.delitem(__import__("sys").modules, "ray", raising=False)
    assert device.ray_assigned_gpu() is None


def test_torch_held_to_avx2_kernels_does_not_count_as_native_bf16():
    # ATen reads ATEN_CPU_CAPABILITY once per process: a fresh interpreter is held to its AVX2 kernels, where
    # bf16 matmuls are emulated whatever CPUID says, so precision choices must fall back to fp32 there too
    import subprocess
    import sys

    probe = "from hybridrl.utils.device import native_bf16; print(native_bf16('cpu'))"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
