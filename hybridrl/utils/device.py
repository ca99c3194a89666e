"""Which device a process computes on: the one owner of that choice.

The driver resolves `trainer.device` once (`resolve_device_type`: `auto` becomes cuda where torch sees a
GPU, else cpu). The worker-group launchers hand the result to every worker process in `DEVICE_ENV`, as
they hand over the torch.distributed coordinates: a Ray group sets it in each actor's environment (cuda
exactly when its pool reserves GPU bundles), the local group in the driver's own environment for the
group's life. Everything that places a model, picks a process-group backend or asks about the device
(FSDP mesh, CUDA index, peak FLOP/s, `auto` dtype, vLLM's memory mode, RNG state) asks this module, so
`trainer.device=cpu` on a machine with a GPU keeps every worker on the CPU.

Fallback, where `DEVICE_ENV` is unset (a process no worker group started: a script or notebook that
builds engines itself): cuda when torch sees a GPU, else cpu.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch

# Set by the worker-group launchers: "cpu" or "cuda", the device type of the worker processes.
DEVICE_ENV = "HYBRIDRL_DEVICE"
DEVICE_TYPES = ("cpu", "cuda")
AUTO = "auto"


def resolve_device_type(setting: str) -> str:
    """`trainer.device` as a device type: `auto` is cuda where torch sees a GPU, else cpu; cpu and cuda
    stay as they are (the config checks say what is wrong with any other value)."""
    if setting == AUTO:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return setting


def device_setting_problem(setting: str, key: str = "trainer.device") -> str | None:
    """What is wrong with `setting` (a `trainer.device` after `resolve_device_type`) here, or None: the one
    check behind every entry point's config validation."""
    if setting not in DEVICE_TYPES:
        return f"{key} must be 'cpu', 'cuda' or 'auto', got {setting!r}"
    if setting == "cuda" and not torch.cuda.is_available():
        return f"{key}=cuda but torch sees no GPU; set {key}=cpu (or {AUTO}: cuda where a GPU is visible)"
    return None


def device_type() -> str:
    """This process's device type: `DEVICE_ENV` as its launcher set it, else the fallback (module doc)."""
    value = os.environ.get(DEVICE_ENV)
    if not value:
        return resolve_device_type(AUTO)
    if value not in DEVICE_TYPES:
        raise RuntimeError(f"{DEVICE_ENV}={value!r}: expected one of {DEVICE_TYPES} (worker groups set it "
                           f"from trainer.device)")
    return value


def cuda_index(local_rank: int) -> int:
    """The CUDA device index a rank with `local_rank` (its position on its node) computes on.

    The index counts the devices this process can see, not the node's. A process that sees one GPU uses
    it (index 0): Ray narrows CUDA_VISIBLE_DEVICES so each GPU actor sees only its own. A Ray actor that
    sees several (Ray leaves them all visible under RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES) takes the
    GPU Ray assigned it (`ray_assigned_gpu`), which need not be the one at its local rank. Any other process
    that sees several takes the one at its local rank: the local backend's single rank (local rank 0) and
    launchers such as torchrun leave every GPU of the node visible. A local rank beyond the visible
    devices means more ranks on the node than GPUs: it raises here, where NCCL would later refuse two
    ranks on one device with a less telling message.
    """
    count = torch.cuda.device_count()
    if count == 0:
        raise RuntimeError(f"this process computes on cuda ({DEVICE_ENV}) but torch sees no GPU in it "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); "
                           f"set trainer.device=cpu or give the workers GPUs")
    if count == 1:
        return 0
    assigned = ray_assigned_gpu()
    if assigned is not None:
        return visible_index(assigned)
    if local_rank >= count:
        raise RuntimeError(f"local rank {local_rank} has no GPU of its own: this process sees {count} GPUs; "
                           f"lower trainer.n_gpus_per_node to at most the GPUs per node")
    return local_rank


def ray_assigned_gpu() -> str | None:
    """The id of the one GPU Ray assigned this process, where it is a Ray actor that holds exactly one;
    else None (the driver, CPU actors, processes that never imported ray)."""
    ray = sys.modules.get("ray")  # a process that never imported ray is not a Ray actor
    if ray is None or not ray.is_initialized():
        return None
    ids = ray.get_gpu_ids()
    return str(ids[0]) if len(ids) == 1 else None


def visible_index(gpu_id: str) -> int:
    """The index torch gives the GPU with node id `gpu_id`: its position in CUDA_VISIBLE_DEVICES when that
    is set, else the id itself."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return int(gpu_id)
    ids = [part.strip() for part in visible.split(",")]
    if gpu_id not in ids:
        raise RuntimeError(f"Ray assigned this actor GPU {gpu_id}, which CUDA_VISIBLE_DEVICES={visible!r} hides "
                           f"from it; unset CUDA_VISIBLE_DEVICES in the actors' environment")
    return ids.index(gpu_id)


def local_device(local_rank: int | None = None) -> torch.device:
    """The device of the rank with `local_rank` in this process (default: the LOCAL_RANK its launcher set,
    0 where none did): the CPU, or the CUDA device `cuda_index` picks."""
    if device_type() == "cpu":
        return torch.device("cpu")
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return torch.device("cuda", cuda_index(local_rank))


def distributed_backend() -> str:
    """The process group's backends: gloo alone on CPU; on CUDA, nccl for CUDA tensors and gloo for the
    CPU tensors that still meet in collectives (offloaded state, counts reduced as Python numbers)."""
    return "cpu:gloo,cuda:nccl" if device_type() == "cuda" else "gloo"


def cuda_in_use() -> bool:
    """Whether this process has started CUDA (memory reports read CUDA's peaks only then, so a CPU
    process, or a driver that never touches the GPU, does not create a CUDA context to report zero)."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def device_env(device: str) -> dict[str, str]:
    """The environment variables that hand a resolved device type to a worker process."""
    if device not in DEVICE_TYPES:
        raise ValueError(f"a worker's device type must be one of {DEVICE_TYPES}, got {device!r}")
    return {DEVICE_ENV: device}


@contextmanager
def pinned(device: str) -> Iterator[None]:
    """This process computes on `device` (cpu / cuda / auto) inside the block; the previous setting
    (or its absence) comes back afterwards. For a driver that is its own single worker."""
    saved = os.environ.get(DEVICE_ENV)
    os.environ.update(device_env(resolve_device_type(device)))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(DEVICE_ENV, None)
        else:
            os.environ[DEVICE_ENV] = saved
