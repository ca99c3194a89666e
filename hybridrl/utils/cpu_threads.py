"""Torch threads on a CPU: the given count less the cores other processes keep busy, since OpenMP threads
spin for a descheduled peer and a busy neighbour then costs far more than its share (benchmarks/contention.py).
`HYBRIDRL_CPU_THREADS=fixed` keeps the given count (bit-identical reruns)."""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass

import torch

from hybridrl.utils.device import device_type

logger = logging.getLogger(__name__)

POLICY_ENV = "HYBRIDRL_CPU_THREADS"
POLICIES = ("adaptive", "fixed")
# How often the load is sampled: /proc/stat's 10 ms ticks measure half a second to within a few percent.
SAMPLE_INTERVAL_S = 0.5
# The first fit's window, so that a process started beside a busy neighbour fits before its first step.
FIRST_WINDOW_S = 0.1
# /proc/stat's per-CPU columns of time not available to us: user, nice, system, irq, softirq, steal.
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class CpuTimes:
    """Seconds at one moment: wall clock, busy time of this process's CPUs (all processes), own CPU time."""

    wall_s: float
    busy_s: float
    own_s: float


def cpu_policy() -> str:
    policy = os.environ.get(POLICY_ENV, "adaptive")
    if policy not in POLICIES:
        raise ValueError(f"{POLICY_ENV}={policy!r}: expected one of {POLICIES} (adaptive fits torch's threads to "
                         f"the cores other processes leave free; fixed keeps the count torch was given)")
    return policy


def read_cpu_times(cpus: set[int], stat_path: str = "/proc/stat") -> CpuTimes | None:
    """The CPU times now, or None where `stat_path` cannot be read (not Linux)."""
    try:
        with open(stat_path) as stat:
            lines = stat.read().splitlines()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    busy = 0
    for line in lines:
        name, *columns = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            busy += sum(int(columns[i]) for i in _BUSY_COLUMNS if i < len(columns))
    return CpuTimes(wall_s=time.monotonic(), busy_s=busy / ticks, own_s=time.process_time())


def others_busy_cores(before: CpuTimes, after: CpuTimes) -> float:
    """How many cores, on average between the two readings, other processes kept busy."""
    wall = after.wall_s - before.wall_s
    if wall <= 0:
        return 0.0
    return max(0.0, (after.busy_s - before.busy_s) - (after.own_s - before.own_s)) / wall


def threads_for(given: int, cpus: int, others_busy: float) -> int:
    """`given` threads, less one for each core that others keep more than half busy; never fewer than one."""
    free = cpus - others_busy
    return max(1, min(given, math.floor(free + 0.5)))


class CpuThreadFit:
    """The process's thread count, refitted to the load at most every `SAMPLE_INTERVAL_S` (CPU, adaptive
    policy); a count someone else sets (`torch.set_num_threads`) becomes the new given count."""

    def __init__(self, stat_path: str = "/proc/stat") -> None:
        self.stat_path = stat_path
        self.cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
        self.given: int | None = None
        self.chosen: int | None = None
        self.last: CpuTimes | None = None
        self.next_sample = 0.0
        self.changes = 0

    def fit(self) -> int | None:
        """Refit if a sample is due; returns the thread count it set, or None when it left torch's alone."""
        now = time.monotonic()
        if now < self.next_sample:
            return None
        self.next_sample = now + SAMPLE_INTERVAL_S
        if cpu_policy() != "adaptive" or device_type() != "cpu":
            self.last = None
            return None
        current = torch.get_num_threads()
        if current != self.chosen:  # someone else set the count: that is the given count now
            self.given = current
        if self.given <= 1:  # nothing to take away
            self.chosen, self.last = current, None
            return None
        before = self.last
        if before is None:  # the first fit of the process measures a short window of its own
            before = read_cpu_times(self.cpus, self.stat_path)
            time.sleep(FIRST_WINDOW_S)
        sample = self.last = read_cpu_times(self.cpus, self.stat_path)
        if sample is None or before is None:
            self.chosen = current
            return None
        others = others_busy_cores(before, sample)
        wanted = threads_for(self.given, len(self.cpus), others)
        self.chosen = wanted
        if wanted == current:
            return None
        torch.set_num_threads(wanted)
        self.changes += 1
        # the first change says that something else is slowing the run (a warning reaches Ray's driver too)
        (logger.warning if self.changes == 1 else logger.debug)(
            "torch threads %d -> %d: other processes keep %.1f of the %d cores this process may use busy "
            "(%s=fixed keeps %d)", current, wanted, others, len(self.cpus), POLICY_ENV, self.given)
        return wanted


_FIT: CpuThreadFit | None = None


def fit_cpu_threads() -> None:
    """`CpuThreadFit.fit` of this process; cheap enough to call between any two ops."""
    global _FIT
    if _FIT is None:
        _FIT = CpuThreadFit()
    _FIT.fit()


def restore_given_threads() -> None:
    """Give this process back the count the fit started from (a local run's driver), forgetting the load seen."""
    global _FIT
    fit, _FIT = _FIT, None
    if fit is not None and fit.given is not None and fit.chosen is not None and torch.get_num_threads() == fit.chosen:
        torch.set_num_threads(fit.given)
