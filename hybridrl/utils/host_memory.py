"""Keep freed host memory in the process for the next tensor, instead of handing it back to the kernel.

A training or decoding pass on a CPU allocates and frees activations of a few to tens of megabytes
many times a second. glibc's malloc serves such blocks with mmap and returns them with munmap when
freed (above its mmap threshold), and trims the top of its heap whenever more than the trim threshold
is free, so the next tensor of that size touches fresh pages again: each 4 KiB page is a page fault
and is zeroed by the kernel. A 50M-parameter bf16 update of 128 rows took ~200,000 page faults per
step that way, and ~2,000 with the settings below (benchmarks/README.md, "Host memory").

`keep_freed_memory` raises both thresholds with `mallopt` (what the MALLOC_MMAP_THRESHOLD_ and
MALLOC_TRIM_THRESHOLD_ environment variables set at start-up): blocks up to 32 MiB come from the heap,
and freed memory stays there unless over 1 GiB of it is free at the top. The cost is a resident size that
stays near the process's peak instead of shrinking between passes. Other C libraries (musl) and other
systems are left alone, and so is a process started with HYBRIDRL_KEEP_FREED_MEMORY=0.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# mallopt parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc caps M_MMAP_THRESHOLD at 32 MiB on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX)
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 1024 * 1024 * 1024

KEEP_ENV = "HYBRIDRL_KEEP_FREED_MEMORY"

_applied = False


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds for this process (once). Returns whether they are set."""
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
