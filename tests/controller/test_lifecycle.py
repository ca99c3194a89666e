"""A run's cleanup also runs on SIGTERM, and a Ray the driver started goes down with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridrl.controller import sigterm_raises_exit

REPO = Path(__file__).resolve().parents[2]


def run_child(code: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)


def test_the_handler_is_installed_only_inside_the_block():
    # from the default disposition, whatever an earlier test left (ray.init installs its own handler)
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with sigterm_raises_exit():
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

        def own(signum, frame):
            pass

        signal.signal(signal.SIGTERM, own)
        with sigterm_raises_exit():  # a program's own handler is left alone
            assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_sigterm_runs_the_finally_blocks_and_exits_143():
    child = run_child(
        "import os, signal, time\n"
        "from hybridrl.controller import sigterm_raises_exit\n"
        "try:\n"
        "    with sigterm_raises_exit():\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(60)\n"
        "finally:\n"
        "    print('cleaned up', flush=True)\n"
    )
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 128 + signal.SIGTERM
    assert "cleaned up" in out


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, from /proc (ppid is the 2nd field after the command name)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited and only waits for its parent to collect it


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from Linux /proc")
def test_sigterm_to_the_driver_shuts_down_the_ray_it_started():
    child = run_child(
        "import time\n"
        "from hybridrl.controller import ray_for_backend, sigterm_raises_exit\n"
        "with sigterm_raises_exit(), ray_for_backend('ray', num_cpus=1):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(300)\n"
    )
    try:
        for line in child.stdout:
            if line.strip() == "ready":
                break
        else:
            pytest.fail("the child exited before Ray started")
        ray_processes = descendants(child.pid)
        assert ray_processes, "ray.init started no processes under the driver"
        child.send_signal(signal.SIGTERM)
        status = child.wait(timeout=60)
        output = child.stdout.read()
        deadline = time.monotonic() + 10  # a SIGKILLed driver's cluster lingers ~60 s: this tells them apart
        while any(alive(p) for p in ray_processes) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not [p for p in ray_processes if alive(p)], f"Ray processes outlived the driver:\n{output}"
        # SystemExit rather than death by the signal: Ray's own handler (exit 15) replaced ours (143).
        # A driver on a loaded 2-core CI machine once died of SIGABRT (-6) here, not reproduced in 9
        # quiet runs: an abort in Ray's native teardown is tolerated as long as the cluster stopped
        # (what this test guards, checked above); the output is kept in the messages to tell more.
        assert status in (15, 128 + signal.SIGTERM, -signal.SIGABRT), f"exit status {status}:\n{output}"
    finally:
        if child.poll() is None:
            child.kill()
