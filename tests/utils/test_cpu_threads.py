"""The thread fit: a busy neighbour on one of the process's cores takes a thread away, and only then."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hybridrl.controller import Dispatch, Worker, register
from hybridrl.controller.ray import RayResourcePool, rank_environment
from hybridrl.controller.worker_group import ClassWithInitArgs, LocalWorkerGroup
from hybridrl.utils import cpu_threads
from hybridrl.utils.cpu_threads import CpuThreadFit, CpuTimes, others_busy_cores, read_cpu_times, threads_for


@pytest.mark.parametrize(("given", "cpus", "others", "expected"), [
    (2, 2, 0.0, 2),   # alone
    (2, 2, 0.45, 2),  # a neighbour that uses under half a core leaves both
    (2, 2, 0.55, 1),  # over half a core: one thread fewer
    (2, 2, 1.0, 1),   # one busy neighbour
    (2, 2, 2.0, 1),   # never fewer than one
    (4, 4, 1.0, 3),
    (4, 4, 2.6, 1),
    (2, 16, 3.0, 2),  # others on other cores leave the given count
    (1, 2, 0.0, 1),
])
def test_threads_for_takes_a_thread_per_core_others_keep_more_than_half_busy(given, cpus, others, expected):
    assert threads_for(given, cpus, others) == expected


def test_others_busy_is_the_cpus_busy_time_less_this_processs_own_per_wall_second():
    before = CpuTimes(wall_s=10.0, busy_s=100.0, own_s=5.0)
    after = CpuTimes(wall_s=12.0, busy_s=103.0, own_s=6.0)  # 3 busy CPU-seconds in 2 s, 1 of them ours
    assert others_busy_cores(before, after) == pytest.approx(1.0)
    assert others_busy_cores(after, after) == 0.0
    # ticks make the CPUs' count coarser than our own: never a negative load
    assert others_busy_cores(before, CpuTimes(wall_s=11.0, busy_s=100.5, own_s=6.0)) == 0.0


def _stat(busy_ticks: dict[int, int]) -> str:
    """A /proc/stat whose CPU n spent busy_ticks[n] ticks as user 1/2, system 1/4, irq, softirq and steal
    1/12 each (guest time is inside user, so it must not count again), and much time idle and in iowait."""
    lines = [f"cpu  {sum(busy_ticks.values())} 0 0 0 0 0 0 0 0 0"]
    for cpu, ticks in busy_ticks.items():
        user, system, small = ticks // 2, ticks // 4, ticks // 12
        lines.append(f"cpu{cpu} {user} 0 {system} 99999 777 {small} {small} {small} {user} 0")
    return "\n".join([*lines, "intr 1 2 3", "ctxt 42", "btime 1", "processes 5"]) + "\n"


def test_read_cpu_times_sums_the_busy_columns_of_the_cpus_the_process_may_use(tmp_path: Path):
    stat = tmp_path / "stat"
    stat.write_text(_stat({0: 1200, 1: 2400, 2: 12000}))
    ticks = os.sysconf("SC_CLK_TCK")
    times = read_cpu_times({0, 1}, str(stat))
    assert times.busy_s == pytest.approx((1200 + 2400) / ticks)  # cpu2 is not ours; the total line not a CPU
    assert read_cpu_times({0}, str(tmp_path / "missing")) is None


@pytest.fixture
def given_two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _refit(fit: CpuThreadFit) -> int | None:
    fit.next_sample = 0.0  # a sample is due now
    return fit.fit()


def test_the_fit_follows_the_load_and_adopts_a_count_set_by_someone_else(tmp_path: Path, given_two_threads):
    stat = tmp_path / "stat"
    fit = CpuThreadFit(str(stat))
    fit.cpus = {0, 1, 2, 3}
    busy = 0
    stat.write_text(_stat({0: busy}))
    assert _refit(fit) is None  # the first fit measures a short window of its own: nothing busy in it
    busy += 10**7  # more busy ticks than the window holds: every CPU taken by others
    stat.write_text(_stat({0: busy}))
    assert _refit(fit) == 1 and torch.get_num_threads() == 1
    assert _refit(fit) == 2 and torch.get_num_threads() == 2  # no busy ticks since: the given count again
    torch.set_num_threads(3)  # the caller's own choice becomes the given count
    assert _refit(fit) is None and fit.given == 3 and torch.get_num_threads() == 3
    busy += 10**7
    stat.write_text(_stat({0: busy}))
    assert _refit(fit) == 1 and fit.given == 3


def _spin_on(cpu: int) -> subprocess.Popen:
    """A real neighbour: a single-threaded Python loop pinned to `cpu`."""
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    return subprocess.Popen([sys.executable, "-c", code])


@pytest.mark.skipif(not Path("/proc/stat").exists() or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux's /proc/stat and two CPUs")
def test_a_busy_neighbour_on_one_of_our_cpus_takes_a_thread_and_fixed_keeps_it(monkeypatch, given_two_threads):
    cpus = sorted(os.sched_getaffinity(0))[:2]
    fit = CpuThreadFit()
    fit.cpus = set(cpus)
    neighbour = _spin_on(cpus[0])
    try:
        time.sleep(0.3)  # it starts
        assert _refit(fit) == 1 and torch.get_num_threads() == 1  # the first fit's own window sees it
        torch.set_num_threads(2)
        monkeypatch.setenv(cpu_threads.POLICY_ENV, "fixed")
        monkeypatch.setattr(cpu_threads, "_FIT", fit)
        for _ in range(2):
            fit.next_sample = 0.0
            cpu_threads.fit_cpu_threads()
            time.sleep(cpu_threads.SAMPLE_INTERVAL_S)
        assert torch.get_num_threads() == 2
    finally:
        neighbour.kill()
        neighbour.wait()


def test_a_policy_that_is_neither_raises_naming_the_variable(monkeypatch):
    monkeypatch.setenv(cpu_threads.POLICY_ENV, "auto")
    with pytest.raises(ValueError, match="HYBRIDRL_CPU_THREADS='auto'.*adaptive.*fixed"):
        cpu_threads.cpu_policy()


def test_ray_ranks_get_the_drivers_policy(monkeypatch):
    pool = RayResourcePool([1], use_gpu=False)
    monkeypatch.delenv(cpu_threads.POLICY_ENV, raising=False)
    assert cpu_threads.POLICY_ENV not in rank_environment(pool, 0, 0, 1, ("127.0.0.1", 1), 2)
    monkeypatch.setenv(cpu_threads.POLICY_ENV, "fixed")
    assert rank_environment(pool, 0, 0, 1, ("127.0.0.1", 1), 2)[cpu_threads.POLICY_ENV] == "fixed"


def _install_fit_that_will_see_a_busy_cpu(tmp_path: Path, monkeypatch) -> None:
    """The process's fit, under the default (adaptive) policy, with its next sample due and showing one of its
    two CPUs busy with others' work since the last."""
    stat = tmp_path / "stat"
    fit = CpuThreadFit(str(stat))
    fit.cpus = {0, 1}
    stat.write_text(_stat({0: 0}))
    _refit(fit)
    stat.write_text(_stat({0: 10**7}))
    fit.next_sample = 0.0
    monkeypatch.setattr(cpu_threads, "_FIT", fit)
    monkeypatch.delenv(cpu_threads.POLICY_ENV, raising=False)


def test_a_worker_method_runs_with_the_count_fitted_just_before_it(tmp_path: Path, monkeypatch, given_two_threads):
    class Probe:
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def threads(self) -> int:
            return torch.get_num_threads()

    _install_fit_that_will_see_a_busy_cpu(tmp_path, monkeypatch)
    assert Probe().threads() == 1


class _ThreadsWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def threads(self) -> int:
        return torch.get_num_threads()


def test_a_local_run_gives_its_driver_the_count_back_when_its_group_shuts_down(tmp_path, monkeypatch,
                                                                                given_two_threads):
    _install_fit_that_will_see_a_busy_cpu(tmp_path, monkeypatch)
    group = LocalWorkerGroup(ClassWithInitArgs(_ThreadsWorker), device="cpu")
    try:
        assert group.call("threads") == [1]  # the load took a thread for the run
    finally:
        group.shutdown()
    assert torch.get_num_threads() == 2 and cpu_threads._FIT is None
