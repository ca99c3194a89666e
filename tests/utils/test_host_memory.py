"""keep_freed_memory changes where glibc serves a tensor's memory: from the heap, kept after a free.

The effect on page faults is measured in benchmarks/host_memory.py; here only the mechanism is checked,
through glibc's own accounting (mallinfo2), which no machine load can move.
"""

import ctypes
import subprocess
import sys

import pytest

# Allocates a 16 MiB tensor, frees it, and prints glibc's counters at each point:
# hblkhd = bytes in mmapped blocks, fordblks = free bytes kept in the heap.
ACCOUNTING = """
import ctypes, sys, torch
from hybridrl.utils.device import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "keep":
    assert keep_freed_memory()
before = libc.mallinfo2()
block = torch.empty(4 * 1024 * 1024, dtype=torch.float32)  # 16 MiB
held = libc.mallinfo2()
del block
freed = libc.mallinfo2()
print(held.hblkhd - before.hblkhd, freed.fordblks - before.fordblks)
"""

MIB = 1024 * 1024


def _has_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


def _accounting(mode: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", ACCOUNTING, mode], capture_output=True, text=True, check=True)
    mmapped, kept_free = out.stdout.strip().splitlines()[-1].split()
    return int(mmapped), int(kept_free)


@pytest.mark.skipif(not _has_mallinfo2(), reason="glibc >= 2.33 (mallinfo2) only")
def test_default_malloc_maps_a_large_tensor_and_unmaps_it_on_free():
    mmapped, kept_free = _accounting("default")
    assert mmapped >= 16 * MIB
    assert kept_free < 16 * MIB


@pytest.mark.skipif(not _has_mallinfo2(), reason="glibc >= 2.33 (mallinfo2) only")
def test_kept_memory_serves_a_large_tensor_from_the_heap_and_keeps_it_after_free():
    mmapped, kept_free = _accounting("keep")
    assert mmapped == 0
    # the block's 16 MiB, less the few KiB the interpreter allocates from the same free space meanwhile
    assert kept_free >= 15 * MIB
