"""Run untrusted Python (model-written code) in an isolated, resource-limited process.

`run_code(code, stdin, limits)` writes the code to a fresh temporary directory and starts
`_sandbox_launcher.py`, which (as root) gives it new mount/network/PID/IPC/UTS namespaces, hides
world-writable directories and the home directory behind throwaway tmpfs, sets rlimits (CPU, address
space, processes, file size, open files), drops to a random unprivileged uid and execs
`python -I -S` with an empty environment. This side enforces the wall-clock limit and the output cap by
killing the sandbox's PID 1 (which takes its whole PID namespace down) and its process group, then
removes the directory. What this does and does not protect against: SANDBOX.md next to this file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_LAUNCHER = Path(__file__).with_name("_sandbox_launcher.py")
_READ_CHUNK = 65536


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Every limit of one sandboxed run (all settable, e.g. from `reward_model.sandbox.*`)."""

    wall_seconds: float = 10.0  # killed after this much real time
    cpu_seconds: int = 5  # RLIMIT_CPU (SIGXCPU, then SIGKILL one second later)
    address_space_bytes: int = 1 << 30  # RLIMIT_AS: allocations beyond raise MemoryError
    max_processes: int = 16  # RLIMIT_NPROC of the sandbox's own uid
    output_bytes: int = 1 << 20  # stdout + stderr; the run is killed when it prints more
    file_size_bytes: int = 16 << 20  # RLIMIT_FSIZE: largest file the code may write
    max_open_files: int = 64  # RLIMIT_NOFILE
    tmpfs_bytes: int = 32 << 20  # size of each tmpfs hiding a host directory
    max_workers: int = 2  # parallel runs in `run_many`
    python: str = os.path.realpath(sys.executable)
    python_flags: tuple[str, ...] = ("-I", "-S")  # isolated mode, no site-packages
    namespaces: tuple[str, ...] = ("mount", "network", "pid", "ipc", "uts")
    # Refuse to run (status "sandbox_error") rather than run with a namespace the OS refuses.
    require_isolation: bool = True
    hidden_paths: tuple[str, ...] = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", os.path.expanduser("~"))
    uid_range: tuple[int, int] = (100_000, 165_536)  # a random uid per run; none of them own any file
    work_root: str = tempfile.gettempdir()  # host directory under which run directories are made

    def __post_init__(self) -> None:
        for field in ("wall_seconds", "cpu_seconds", "address_space_bytes", "max_processes", "output_bytes",
                      "file_size_bytes", "max_open_files", "tmpfs_bytes", "max_workers"):
            if getattr(self, field) <= 0:
                raise ValueError(f"SandboxLimits.{field} must be positive, got {getattr(self, field)!r}")


@dataclasses.dataclass
class SandboxResult:
    """Outcome of one run. `status` is one of: ok, runtime_error, memory_error, timeout, cpu_limit,
    output_limit, killed (by another signal), sandbox_error (the sandbox itself could not start)."""

    status: str
    stdout: str
    stderr: str
    exit_code: int | None
    wall_time: float
    cpu_time: float | None
    max_rss: int | None  # bytes
    isolation: dict[str, bool]
    error: str | None = None


def _launcher_config(limits: SandboxLimits, workdir: str, status_fd: int) -> dict:
    as_root = os.geteuid() == 0
    hidden = [p for p in limits.hidden_paths if os.path.isdir(p)]
    prefix = os.path.realpath(sys.base_prefix if limits.python == os.path.realpath(sys.executable)
                              else str(Path(limits.python).parent.parent))
    # The interpreter is bound back read-only when a hidden directory covers it (e.g. under ~).
    expose = [prefix] if any(prefix == h or prefix.startswith(h.rstrip("/") + "/") for h in hidden) else []
    return {
        "status_fd": status_fd,
        "workdir": workdir,
        "sandbox_dir": "/tmp/sandbox",
        "stdin_path": os.path.join(workdir, ".stdin"),
        "script": "main.py",
        "python": limits.python,
        "python_flags": list(limits.python_flags),
        "namespaces": list(limits.namespaces) if as_root else [],
        "require_isolation": limits.require_isolation,
        "hidden_paths": hidden,
        "expose_paths": expose,
        "tmpfs_bytes": limits.tmpfs_bytes,
        "uid": random.randrange(*limits.uid_range) if as_root else None,
        "cpu_seconds": limits.cpu_seconds,
        "address_space_bytes": limits.address_space_bytes,
        "max_processes": limits.max_processes,
        "file_size_bytes": limits.file_size_bytes,
        "max_open_files": limits.max_open_files,
    }


class _Run:
    """One launched sandbox: pumps its pipes, enforces wall time and output cap, kills it."""

    def __init__(self, limits: SandboxLimits, workdir: str) -> None:
        self.limits = limits
        status_r, status_w = os.pipe()
        cfg = _launcher_config(limits, workdir, status_w)
        if os.geteuid() != 0 and limits.require_isolation:
            os.close(status_r)
            os.close(status_w)
            raise PermissionError("the sandbox needs root for namespaces and a uid switch; "
                                  "set require_isolation=False to run with rlimits only (see SANDBOX.md)")
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_LAUNCHER), json.dumps(cfg)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(status_w,), start_new_session=True, env={}, cwd=workdir,
        )
        os.close(status_w)
        self.status_r = status_r
        self.out = {"stdout": bytearray(), "stderr": bytearray(), "status": bytearray()}
        self.child_pid: int | None = None

    def pump(self) -> str | None:
        """Read until every pipe closes; returns "timeout"/"output_limit" if the run had to be killed."""
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ, "stdout")
        sel.register(self.proc.stderr, selectors.EVENT_READ, "stderr")
        sel.register(self.status_r, selectors.EVENT_READ, "status")
        deadline = time.monotonic() + self.limits.wall_seconds
        verdict = None
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                verdict = verdict or "timeout"
                self.kill()
                remaining = 1.0  # the kill closes the pipes; drain what is left
                deadline = time.monotonic() + 5.0
            for key, _ in sel.select(timeout=remaining):
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                self.out[key.data] += chunk
                if key.data == "status":
                    self._note_child_pid()
                elif len(self.out["stdout"]) + len(self.out["stderr"]) > self.limits.output_bytes:
                    verdict = verdict or "output_limit"
                    self.kill()
        sel.close()
        return verdict

    def _note_child_pid(self) -> None:
        for line in self.out["status"].decode(errors="replace").splitlines():
            if line.startswith("{") and line.endswith("}") and '"child_pid"' in line:
                self.child_pid = json.loads(line)["child_pid"]

    def kill(self) -> None:
        """Kill the sandbox's PID 1: its death kills every process in its PID namespace, even ones
        that left our process group with setsid(). The launcher still waits on it (so the pid cannot
        have been reused) and then reports its resource use. Without a known PID 1, kill the group."""
        if self.child_pid is not None and self.proc.poll() is None:
            _signal(lambda: os.kill(self.child_pid, signal.SIGKILL))
        else:
            self.kill_group()

    def kill_group(self) -> None:
        _signal(lambda: os.killpg(self.proc.pid, signal.SIGKILL))

    def status_fields(self) -> dict:
        fields: dict = {}
        for line in self.out["status"].decode(errors="replace").splitlines():
            if line.strip():
                fields.update(json.loads(line))
        return fields


def _signal(send) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        send()


def _classify(verdict: str | None, fields: dict, stderr: str, limits: SandboxLimits) -> str:
    if "setup_error" in fields:
        return "sandbox_error"
    if verdict:
        return verdict
    code = fields.get("exit_code")
    if code is None:
        return "sandbox_error"
    if code == 0:
        return "ok"
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and (fields.get("cpu_time") or 0) >= limits.cpu_seconds):
        return "cpu_limit"
    if code < 0:
        return "killed"
    return "memory_error" if "MemoryError" in stderr else "runtime_error"


def run_code(code: str, stdin: str | bytes | None = None, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` as `main.py` in a fresh sandbox with `stdin` as its standard input."""
    limits = limits or SandboxLimits()
    workdir = tempfile.mkdtemp(prefix="hybridrl-sandbox-", dir=limits.work_root)
    start = time.monotonic()
    try:
        Path(workdir, "main.py").write_text(code)
        data = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
        Path(workdir, ".stdin").write_bytes(data)
        os.chmod(workdir, 0o755)
        run = _Run(limits, workdir)
        try:
            verdict = run.pump()
        finally:
            run.kill_group()  # nothing of this run may outlive it
            run.proc.wait()
            os.close(run.status_r)
        fields = run.status_fields()
        stdout = run.out["stdout"][: limits.output_bytes].decode(errors="replace")
        stderr = run.out["stderr"][: limits.output_bytes].decode(errors="replace")
        max_rss = fields.get("max_rss_kb")
        return SandboxResult(
            status=_classify(verdict, fields, stderr, limits),
            stdout=stdout, stderr=stderr,
            exit_code=fields.get("exit_code"),
            wall_time=time.monotonic() - start,
            cpu_time=fields.get("cpu_time"),
            max_rss=None if max_rss is None else max_rss * 1024,
            isolation=fields.get("isolation", {}),
            error=fields.get("setup_error"),
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_many(
    jobs: Sequence[tuple[str, str | bytes | None]], limits: SandboxLimits | None = None
) -> list[SandboxResult]:
    """Run `(code, stdin)` jobs, at most `limits.max_workers` at a time; results keep the input order."""
    limits = limits or SandboxLimits()
    with ThreadPoolExecutor(max_workers=limits.max_workers) as pool:
        return list(pool.map(lambda job: run_code(job[0], job[1], limits), jobs))
