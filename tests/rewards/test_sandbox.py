"""Hostile programs in the sandbox: each must be contained, reported, and leave the host unaffected.

These need root (namespaces, a uid switch); where the sandbox cannot isolate, they are skipped with the
reason, since running them unisolated would endanger the machine. The hosts that refuse namespaces,
and the weaker mode for them, are probed in tests/faults/test_sandbox_faults.py.
"""

import contextlib
import os
import socket
import sys
import threading
from pathlib import Path

import pytest

from hybridrl.rewards.sandbox import (
    SandboxLimits,
    SandboxUnavailableError,
    require_sandbox,
    run_code,
    run_many,
    sandbox_available,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the isolated sandbox needs root (see SANDBOX.md)")

# Tight limits keep the hostile cases short; each case asserts the limit that stopped it.
LIMITS = SandboxLimits(wall_seconds=5, cpu_seconds=2, max_processes=8, output_bytes=1 << 20)


def _sandbox_uids_alive() -> list[int]:
    """Processes on the host that run under a sandbox uid (none may survive a run)."""
    low, high = LIMITS.uid_range
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uid = entry.stat().st_uid
            except FileNotFoundError:
                continue
            if low <= uid < high:
                alive.append(int(entry.name))
    return alive


def test_stdin_stdout_and_clean_environment():
    result = run_code("import os, sys\nprint(sys.stdin.read()[::-1], os.getcwd(), os.getuid() != 0)", "abc")
    assert result.status == "ok", result
    assert result.stdout.split() == ["cba", "/tmp/sandbox", "True"]
    assert result.isolation == {"mount": True, "network": True, "pid": True, "ipc": True, "uts": True}
    assert result.cpu_time is not None and result.max_rss > 0


def test_runtime_error_is_reported():
    result = run_code("raise SystemExit(3)")
    assert (result.status, result.exit_code) == ("runtime_error", 3)


def test_infinite_loop_hits_the_cpu_limit():
    # a wall limit far above the CPU one: on a busy machine 2 CPU seconds take longer than 5 wall seconds
    limits = SandboxLimits(wall_seconds=120, cpu_seconds=2, max_processes=8, output_bytes=1 << 20)
    result = run_code("while True:\n    pass", limits=limits)
    assert result.status == "cpu_limit", result
    assert not _sandbox_uids_alive()


def test_sleeping_forever_hits_the_wall_limit_even_after_setsid():
    # The child leaves the process group; killing the PID namespace's init still ends it.
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\ntime.sleep(1000)"
    result = run_code(code, limits=SandboxLimits(wall_seconds=1))
    assert result.status == "timeout"
    assert not _sandbox_uids_alive()


def test_fork_bomb_is_capped_and_leaves_nothing_behind():
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    before = len(list(Path("/proc").glob("[0-9]*")))
    result = run_code(code, limits=LIMITS)
    assert result.status in ("timeout", "cpu_limit"), result
    assert not _sandbox_uids_alive()
    # The host's process count did not balloon (other tests on the machine may add a few).
    assert len(list(Path("/proc").glob("[0-9]*"))) < before + 50


def test_fork_count_is_capped_by_max_processes():
    code = (
        "import os, time\nn = 0\nfor _ in range(50):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
        "    n += 1\nprint(n)"
    )
    result = run_code(code, limits=LIMITS)
    # RLIMIT_NPROC = 8 counts the solution itself (the init stays root), so exactly 7 children fit.
    assert result.status == "ok", result
    assert int(result.stdout) == 7


def test_memory_bomb_raises_memory_error():
    limits = SandboxLimits(address_space_bytes=256 << 20, cpu_seconds=10)
    result = run_code("blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))", limits=limits)
    assert result.status == "memory_error", result
    assert result.max_rss <= limits.address_space_bytes


def test_writes_outside_the_work_dir_do_not_reach_the_host(tmp_path):
    host_tmp = Path("/tmp") / f"hybridrl-sandbox-probe-{os.getpid()}"
    # The base interpreter's install is bound into the sandbox (it runs the solution) and is not
    # writable by the sandbox's uid; a checkout or venv under /tmp would be hidden behind the private
    # tmpfs instead. Any OSError (read-only bind, permission, missing directory) means it was refused.
    repo_file = Path(sys.base_prefix).resolve() / "escape_probe.txt"
    code = (
        f"open({str(host_tmp)!r}, 'w').write('x')\n"  # lands in the sandbox's private tmpfs
        f"try:\n    open({str(repo_file)!r}, 'w').write('x')\nexcept OSError:\n    print('denied')\n"
        "open('inside.txt', 'w').write('x')"
    )
    result = run_code(code)
    assert result.status == "ok", result
    assert result.stdout.strip() == "denied"
    assert not host_tmp.exists() and not repo_file.exists()
    assert not list(Path(LIMITS.work_root).glob("hybridrl-sandbox-*"))  # work dirs removed


def test_environment_secrets_are_not_inherited(monkeypatch):
    monkeypatch.setenv("HYBRIDRL_TEST_SECRET", "hunter2")
    # Also look through every visible process's environment (the host's are not visible at all).
    code = (
        "import os\nprint(os.environ.get('HYBRIDRL_TEST_SECRET'))\nleaks = []\n"
        "for p in filter(str.isdigit, os.listdir('/proc')):\n    try:\n"
        "        leaks += [p] if b'hunter2' in open(f'/proc/{p}/environ', 'rb').read() else []\n"
        "    except OSError:\n        pass\nprint(leaks, len(os.listdir('/proc')) > 0)"
    )
    result = run_code(code)
    assert result.status == "ok", result
    assert result.stdout.split("\n")[:2] == ["None", "[] True"]


def test_network_listener_on_the_host_is_unreachable():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3)
    port = server.getsockname()[1]
    accepted = []
    thread = threading.Thread(target=lambda: _accept(server, accepted))
    thread.start()
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
    result = run_code(code)
    thread.join()
    server.close()
    assert result.status == "runtime_error" and "unreachable" in result.stderr, result
    assert accepted == []


def _accept(server: socket.socket, accepted: list) -> None:
    with contextlib.suppress(TimeoutError):
        accepted.append(server.accept())


def test_printing_100mb_is_cut_at_the_cap():
    code = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)"
    result = run_code(code, limits=LIMITS)
    assert result.status == "output_limit"
    assert len(result.stdout) <= LIMITS.output_bytes


def test_killing_the_parent_fails_and_the_host_survives():
    code = f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)"
    result = run_code(code)
    # The host pid does not exist inside the sandbox's PID namespace.
    assert result.status == "runtime_error" and "ProcessLookupError" in result.stderr, result
    assert os.getppid() > 0  # this test process is still alive to check


def test_run_many_keeps_order():
    jobs = [(f"print({i} * {i})", None) for i in range(5)]
    results = run_many(jobs, SandboxLimits(max_workers=2))
    assert [r.stdout.strip() for r in results] == ["0", "1", "4", "9", "16"]


def test_bad_limits_name_the_field():
    with pytest.raises(ValueError, match="SandboxLimits.cpu_seconds"):
        SandboxLimits(cpu_seconds=0)


def test_bad_uid_range_is_named():
    with pytest.raises(ValueError, match="SandboxLimits.uid_range"):
        SandboxLimits(uid_range=(5, 5))


def test_the_probe_finds_full_isolation_on_this_host():
    assert sandbox_available() is None
    assert require_sandbox() == {"mount": True, "network": True, "pid": True, "ipc": True, "uts": True}


def test_an_interpreter_that_cannot_start_raises_instead_of_a_result():
    # Before, the exec failure was an exit code of 127: a "runtime_error" indistinguishable from bad code.
    broken = SandboxLimits(python="/nonexistent/bin/python3")
    with pytest.raises(SandboxUnavailableError, match="could not start the interpreter /nonexistent/bin/python3 "
                                                      "as its throwaway uid .*FileNotFoundError.*Fix: "):
        run_code("print(1)", limits=broken)
    assert "/nonexistent/bin/python3" in sandbox_available(broken)
    with pytest.raises(SandboxUnavailableError):
        require_sandbox(broken)


def test_concurrent_runs_never_share_a_uid():
    # Two runs overlap (each sleeps 0.5 s, two workers); a range of two uids must give them one each.
    limits = SandboxLimits(uid_range=(200_000, 200_002), max_workers=2)
    jobs = [("import os, time\ntime.sleep(0.5)\nprint(os.getuid())", None)] * 2
    assert sorted(int(r.stdout) for r in run_many(jobs, limits)) == [200_000, 200_001]
