"""This process's device: which one it computes on, the dtypes it computes in, and its memory.

The device type is chosen in one place: the driver resolves `trainer.device` once
(`resolve_device_type`: `auto` becomes cuda where torch sees a GPU, else cpu) and the worker-group
launchers hand the result to every worker process in `DEVICE_ENV`, as they hand over the
torch.distributed coordinates (a Ray group in each actor's environment, cuda exactly when its pool
reserves GPU bundles; the local group in the driver's own environment for the group's life).
Everything that places a model, picks a process-group backend or asks about the device (FSDP mesh,
CUDA index, peak FLOP/s, `auto` dtype, vLLM's memory mode, RNG state) asks this module, so
`trainer.device=cpu` on a machine with a GPU keeps every worker on the CPU. Where `DEVICE_ENV` is
unset (a script or notebook that builds engines itself, no worker group): cuda when torch sees a GPU,
else cpu.

Compute dtypes follow the device (`auto_dtype`, `device_default_dtype`), and memory is reported per
process (`process_memory`) and kept for reuse on the host (`keep_freed_memory`).
"""

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

# Set by the worker-group launchers: "cpu" or "cuda", the device type of the worker processes.
DEVICE_ENV = "HYBRIDRL_DEVICE"
DEVICE_TYPES = ("cpu", "cuda")
AUTO = "auto"  # trainer.device=auto, and a dtype key's `auto`


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


BF16_NAMES = ("bfloat16", "bf16")  # what a dtype key may say for bf16 (hybridrl.models.loading.DTYPES)


def native_bf16(device: str | None = None) -> bool:
    """Whether `device` ("cpu" / "cuda"; default: this process's, `device_type`) multiplies bf16 natively.

    A GPU does when torch reports bf16 support (Ampere and later); a CPU with AVX512_BF16 or AMX
    multiplies bf16 several times faster than fp32, while one without those instructions (AVX2 only)
    emulates bf16 and is slower in it than in fp32 (benchmarks/results/grpo_vs_trl.md, its fp32 and
    bf16 rows).
    """
    device = device or device_type()
    if device == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")  # torch's own CPUID probes
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def auto_dtype(device: str | None = None) -> torch.dtype:
    """bf16 where `native_bf16`, else fp32: what `dtype: auto` means on this process's device.

    Master weights, optimizer state, gradient reduction and log-softmax stay fp32 whatever the compute
    dtype (FSDP2's MixedPrecisionPolicy keeps the sharded parameters in their loaded dtype;
    `logprobs_from_logits` upcasts).
    """
    return torch.bfloat16 if native_bf16(device) else torch.float32


def device_default_dtype(device: str | None = None) -> torch.dtype:
    """What an unset (null) compute dtype means: bf16 on a bf16 GPU, fp32 on a CPU or an older GPU.

    On a GPU that is what verl's defaults compute in; on a CPU the defaults stay what every recipe and
    test was measured with (the quickstart opts in to bf16 with `auto`).
    """
    device = device or device_type()
    return torch.bfloat16 if device == "cuda" and native_bf16("cuda") else torch.float32


def emulated_bf16_warning(key: str, value: str | None, device: str) -> str | None:
    """The warning for dtype key `key` set to bf16 by name (`value`) where the device (`device`, as
    trainer.device resolved) emulates bf16, or None: a CPU without AVX512_BF16 or AMX runs it many times
    slower than fp32 (`native_bf16`), which a user who asked for bf16 to go faster should hear at once."""
    if value not in BF16_NAMES or device != "cpu" or native_bf16("cpu"):
        return None
    return (f"{key}={value} on a CPU without native bf16 (no AVX512_BF16 or AMX; torch's capability: "
            f"{torch.backends.cpu.get_cpu_capability()}): torch emulates bf16 here, many times slower than fp32. "
            f"Set {key}=auto (bf16 only where the CPU multiplies it natively) or float32")


GIB = 1024**3


@dataclass(frozen=True)
class ProcessMemory:
    """One process's peaks in GiB; the CUDA fields are None where this process never initialised CUDA.

    Every worker reports its own (`Worker.process_memory`) and the driver adds its own, so a run's
    metrics cover all of its processes (`hybridrl.trainer.metrics.compute_memory_metrics`).
    """

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
    """The calling process's peaks. CUDA is read only when this process already uses it, so a CPU run
    (or a driver that never touches the GPU) does not create a CUDA context just to report zero."""
    allocated = reserved = None
    if cuda_in_use():
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
    """Set glibc's mmap and trim thresholds for this process (once). Returns whether they are set.

    Keeps freed host memory in the process for the next tensor instead of handing it back to the
    kernel. A training or decoding pass on a CPU allocates and frees activations of a few to tens of
    megabytes many times a second; glibc's malloc serves such blocks with mmap and returns them with
    munmap when freed (above its mmap threshold), and trims the top of its heap whenever more than the
    trim threshold is free, so the next tensor of that size touches fresh pages again, each 4 KiB page a
    page fault zeroed by the kernel (benchmarks/README.md, "Host memory", counts them).

    `mallopt` raises both thresholds (what the MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_
    environment variables set at start-up): blocks up to 32 MiB come from the heap, and freed memory
    stays there unless over 1 GiB of it is free at the top. The cost is a resident size that stays near
    the process's peak instead of shrinking between passes. Other C libraries (musl) and other systems
    are left alone, and so is a process started with HYBRIDRL_KEEP_FREED_MEMORY=0 (`KEEP_ENV`).
    """
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
