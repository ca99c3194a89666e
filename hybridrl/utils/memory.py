"""Peak memory of one process: resident set size, and torch's CUDA allocator peaks where CUDA is in use.

Every worker reports its own (`Worker.process_memory`) and the driver adds its own, so a run's metrics
cover all of its processes (`hybridrl.trainer.metrics.compute_memory_metrics`).
"""

from __future__ import annotations

import os
import resource
import socket
import sys
from dataclasses import dataclass

import torch

from hybridrl.utils.device import cuda_in_use

GIB = 1024**3


@dataclass(frozen=True)
class ProcessMemory:
    """One process's peaks in GiB; the CUDA fields are None where this process never initialised CUDA."""

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
