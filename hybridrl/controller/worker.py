"""Worker: the base class of every SPMD rank (actor, critic, reference, reward model).

A worker group starts one process per rank and gives it the standard torch.distributed environment
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK; MASTER_PORT=0 on rank 0 lets it bind a port of
the OS's choosing, see `rendezvous.py`) and its device type (`hybridrl.utils.device`). The base class
reads them, sets the rank's share of CPU threads, and joins the group's process group: gloo on CPU,
gloo + nccl on CUDA.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable

import torch
import torch.distributed as dist

from hybridrl.controller.decorator import Dispatch, register
from hybridrl.controller.rendezvous import DistEnv, rank_store
from hybridrl.utils.device import (
    ProcessMemory,
    device_type,
    distributed_backend,
    keep_freed_memory,
    local_device,
    process_memory,
)
from hybridrl.utils.flops import ModelPass, device_peak_flops

# Set by the worker group: how many intra-op threads this rank should use.
NUM_THREADS_ENV = "HYBRIDRL_NUM_THREADS"


def init_distributed(env: DistEnv) -> None:
    """Join the group's process group once per process (colocated roles share it)."""
    if dist.is_initialized():
        if dist.get_world_size() != env.world_size or dist.get_rank() != env.rank:
            raise RuntimeError(
                f"this process already belongs to a process group as rank {dist.get_rank()} of "
                f"{dist.get_world_size()}, but a worker asked for rank {env.rank} of {env.world_size}"
            )
        return
    if device_type() == "cuda":
        torch.cuda.set_device(local_device(env.local_rank))
    dist.init_process_group(
        backend=distributed_backend(),
        store=rank_store(env),  # MASTER_PORT=0: rank 0 binds a port of the OS's choosing (rendezvous.py)
        rank=env.rank,
        world_size=env.world_size,
    )


class Worker:
    """Base class of SPMD workers. Subclasses call `super().__init__()` first."""

    def __init__(self) -> None:
        self.dist_env = DistEnv.from_environ()
        threads = os.environ.get(NUM_THREADS_ENV)
        if threads:
            torch.set_num_threads(int(threads))
        keep_freed_memory()  # activations reuse freed heap pages instead of faulting in fresh ones
        init_distributed(self.dist_env)

    @property
    def rank(self) -> int:
        return self.dist_env.rank

    @property
    def world_size(self) -> int:
        return self.dist_env.world_size

    @property
    def local_rank(self) -> int:
        return self.dist_env.local_rank

    @property
    def device(self) -> torch.device:
        """Where this rank computes: the CPU, or its CUDA device (`hybridrl.utils.device.cuda_index`)."""
        return local_device(self.local_rank)

    def measure_peak_flops(self, dtypes: Iterable[torch.dtype]) -> None:
        """Measure this process's peak FLOP/s in each dtype once (`device_peak_flops` caches it).

        A collective: every rank calls it. On CPU the ranks of a node take turns, because they share its
        cores: a rank probing while its neighbours probe too measures a share of the machine, not its own
        peak (concurrent probes measured barely more together than each alone). One at a time gives each
        rank's own figure, as a datasheet gives each GPU's, and as benchmarks/step_breakdown.py measures it.
        """
        dtypes = list(dtypes)
        turns = 1
        if device_type() == "cpu" and dist.is_initialized() and self.world_size > 1:
            most = torch.tensor([self.dist_env.local_world_size], device="cpu")  # a count: gloo reduces it
            dist.all_reduce(most, op=dist.ReduceOp.MAX)
            turns = int(most.item())
        for turn in range(turns):
            if turns == 1 or self.local_rank == turn:
                for dtype in dtypes:
                    device_peak_flops(dtype)
            if turns > 1:
                dist.barrier()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def process_info(self) -> dict:
        """Where this rank runs: for placement checks and debugging."""
        return {
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "rank": self.rank,
            "world_size": self.world_size,
            "num_threads": torch.get_num_threads(),
            "device": str(self.device),
            "backend": dist.get_backend() if dist.is_initialized() else None,
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def process_memory(self) -> ProcessMemory:
        """This rank's process's peak memory (RSS; CUDA allocator peaks where used)."""
        return process_memory()  # the module function, not this method

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def model_passes(self) -> dict[str, ModelPass]:
        """The model passes this rank runs, by name, for MFU (`perf/mfu/<name>`); none by default."""
        return {}
