"""This process's device (`DEVICE_ENV`, set from `trainer.device`), the dtypes it computes in, its memory."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

DEVICE_ENV = "HYBRIDRL_DEVICE"
DEVICE_TYPES = ("cpu", "cuda")
AUTO = "auto"  # trainer.device=auto, and a dtype key's `auto`


def resolve_device_type(setting: str) -> str:
    """`trainer.device` as a device type: `auto` is cuda where torch sees a GPU, else cpu; others unchanged."""
    if setting == AUTO:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return setting


def device_setting_problem(setting: str, key: str = "trainer.device") -> str | None:
    """What is wrong with `setting` (a resolved `trainer.device`) on this machine, or None."""
    if setting not in DEVICE_TYPES:
        return f"{key} must be 'cpu', 'cuda' or 'auto', got {setting!r}"
    if setting == "cuda" and not torch.cuda.is_available():
        return f"{key}=cuda but torch sees no GPU; set {key}=cpu (or {AUTO}: cuda where a GPU is visible)"
    return None


def device_type() -> str:
    """This process's device type: `DEVICE_ENV` as its launcher set it, else cuda where torch sees a GPU."""
    value = os.environ.get(DEVICE_ENV)
    if not value:
        return resolve_device_type(AUTO)
    if value not in DEVICE_TYPES:
        raise RuntimeError(f"{DEVICE_ENV}={value!r}: expected one of {DEVICE_TYPES} (worker groups set it "
                           f"from trainer.device)")
    return value


def cuda_index(local_rank: int) -> int:
    """The visible CUDA device index the rank with `local_rank` computes on: the only one, the one Ray
    assigned, else the one at `local_rank` (raises past them, where NCCL would fail less clearly)."""
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
    """The id of the one GPU Ray assigned this process (a Ray actor holding exactly one), else None."""
    ray = sys.modules.get("ray")  # a process that never imported ray is not a Ray actor
    if ray is None or not ray.is_initialized():
        return None
    ids = ray.get_gpu_ids()
    return str(ids[0]) if len(ids) == 1 else None


def visible_index(gpu_id: str) -> int:
    """The index torch gives the GPU with node id `gpu_id`: its position in CUDA_VISIBLE_DEVICES, if set."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return int(gpu_id)
    ids = [part.strip() for part in visible.split(",")]
    if gpu_id not in ids:
        raise RuntimeError(f"Ray assigned this actor GPU {gpu_id}, which CUDA_VISIBLE_DEVICES={visible!r} hides "
                           f"from it; unset CUDA_VISIBLE_DEVICES in the actors' environment")
    return ids.index(gpu_id)


def local_device(local_rank: int | None = None) -> torch.device:
    """The device of the rank with `local_rank` (default: LOCAL_RANK, else 0): the CPU or `cuda_index`'s GPU."""
    if device_type() == "cpu":
        return torch.device("cpu")
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return torch.device("cuda", cuda_index(local_rank))


def distributed_backend() -> str:
    """gloo on CPU; on CUDA nccl for CUDA tensors and gloo for the CPU tensors that still meet in collectives."""
    return "cpu:gloo,cuda:nccl" if device_type() == "cuda" else "gloo"


def device_env(device: str) -> dict[str, str]:
    """The environment variables that hand a resolved device type to a worker process."""
    if device not in DEVICE_TYPES:
        raise ValueError(f"a worker's device type must be one of {DEVICE_TYPES}, got {device!r}")
    return {DEVICE_ENV: device}


@contextmanager
def pinned(device: str) -> Iterator[None]:
    """Compute on `device` (cpu / cuda / auto) inside the block; the previous setting comes back after."""
    saved = {DEVICE_ENV: os.environ.get(DEVICE_ENV)}
    os.environ.update(device_env(resolve_device_type(device)))
    try:
        yield
    finally:
        restore_env(saved)


def restore_env(saved: dict[str, str | None]) -> None:
    """Put environment variables back to `saved` values (None: the variable was unset)."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


BF16_NAMES = ("bfloat16", "bf16")  # what a dtype key may say for bf16 (hybridrl.models.loading.DTYPES)


def native_bf16(device: str | None = None) -> bool:
    """Whether `device` (default: this process's) multiplies bf16 natively: a capable GPU, or AMX or AVX512_BF16
    with torch running its AVX-512 kernels (`ATEN_CPU_CAPABILITY=avx2` holds it to the AVX2 ones)."""
    device = device or device_type()
    if device == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return False
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")  # torch's own CPUID probes
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def auto_dtype(device: str | None = None) -> torch.dtype:
    """A compute dtype of `auto` on `device` (default: this process's): bf16 on a native-bf16 GPU, else fp32."""
    device = device or device_type()
    return torch.bfloat16 if device == "cuda" and native_bf16("cuda") else torch.float32


def emulated_bf16_warning(key: str, value: str | None, device: str) -> str | None:
    """The warning for dtype key `key` set to bf16 by name on a CPU (`device`) that emulates bf16, else None."""
    if value not in BF16_NAMES or device != "cpu" or native_bf16("cpu"):
        return None
    return (f"{key}={value} on a CPU without native bf16 (AVX512_BF16 or AMX under torch's AVX-512 kernels; "
            f"torch's capability: {torch.backends.cpu.get_cpu_capability()}): torch emulates bf16 here, many times "
            f"slower than fp32. Set {key}=float32 (or auto, fp32 on a CPU)")


GIB = 1024**3


@dataclass(frozen=True)
class ProcessMemory:
    """One process's peaks in GiB (CUDA fields None where it never initialised CUDA)."""

    host: str
    pid: int
    max_rss_gb: float
    cuda_max_allocated_gb: float | None = None
    cuda_max_reserved_gb: float | None = None

    @property
    def key(self) -> tuple[str, int]:
        """Identifies the process across nodes (a pid alone repeats between machines)."""
        return self.host, self.pid


def peak_rss_gb() -> float:
    """This process's peak resident set size from getrusage (ru_maxrss is KiB on Linux, bytes on macOS)."""
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max_rss / (GIB if sys.platform == "darwin" else GIB / 1024)


def process_memory() -> ProcessMemory:
    """The calling process's peaks (CUDA only where it started CUDA: no context just to report zero)."""
    allocated = reserved = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        allocated = torch.cuda.max_memory_allocated() / GIB
        reserved = torch.cuda.max_memory_reserved() / GIB
    return ProcessMemory(socket.gethostname(), os.getpid(), peak_rss_gb(), allocated, reserved)


# mallopt parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc caps M_MMAP_THRESHOLD at 32 MiB on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX)
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 1024 * 1024 * 1024

KEEP_ENV = "HYBRIDRL_KEEP_FREED_MEMORY"

_applied = False


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (once), so freed host memory stays for the
    next tensor; returns whether they are set. Linux with glibc only; `KEEP_ENV`=0 turns it off."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux") or os.environ.get(KEEP_ENV, "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only: other C libraries are left alone
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success
    _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _applied
