"""Run untrusted (model-written) Python in an isolated, resource-limited process: `run_code` starts
`_sandbox_launcher.py` and enforces the wall clock and output cap from here; where no program can run it
raises `SandboxUnavailableError`, never a score. What it protects against: SANDBOX.md next to this file."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hybridrl.rewards.failures import RewardFunctionFatalError

_LAUNCHER = Path(__file__).with_name("_sandbox_launcher.py")
_READ_CHUNK = 65536
_DOC = "hybridrl/rewards/SANDBOX.md"
_OPT_IN = ("reward_model.sandbox.require_isolation=false (from Python: "
           "SandboxLimits(require_isolation=False))")


class SandboxUnavailableError(RewardFunctionFatalError, RuntimeError):
    """The sandbox cannot run programs here; the message says why and how to fix it. Fatal, never a score."""


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
    # True: raise SandboxUnavailableError when the OS refuses a namespace. False: run in the weaker
    # uid-only mode there (no network isolation; what it keeps is listed in SANDBOX.md).
    require_isolation: bool = True
    hidden_paths: tuple[str, ...] = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", os.path.expanduser("~"))
    uid_range: tuple[int, int] = (100_000, 165_536)  # a random uid per run; none of them own any file
    work_root: str = tempfile.gettempdir()  # host directory under which run directories are made

    def __post_init__(self) -> None:
        for field in ("wall_seconds", "cpu_seconds", "address_space_bytes", "max_processes", "output_bytes",
                      "file_size_bytes", "max_open_files", "tmpfs_bytes", "max_workers"):
            if getattr(self, field) <= 0:
                raise ValueError(f"SandboxLimits.{field} must be positive, got {getattr(self, field)!r}")
        low, high = self.uid_range
        if not 0 < low < high:
            raise ValueError(f"SandboxLimits.uid_range must be (low, high) with 0 < low < high, got {self.uid_range!r}")


@dataclasses.dataclass
class SandboxResult:
    """One run. `status`: ok, runtime_error, memory_error, timeout, cpu_limit, output_limit or killed (by
    another signal); `isolation`: the namespaces the run got."""

    status: str
    stdout: str
    stderr: str
    exit_code: int | None
    wall_time: float
    cpu_time: float | None
    max_rss: int | None  # bytes
    isolation: dict[str, bool]


def _python_location(python: str) -> tuple[str, str]:
    """(installation prefix, interpreter path relative to it), symlinks resolved."""
    real = os.path.realpath(python)
    prefix = os.path.realpath(sys.base_prefix)
    if real != os.path.realpath(sys.executable) or not real.startswith(prefix.rstrip("/") + "/"):
        prefix = str(Path(real).parent.parent)  # <prefix>/bin/python
    return prefix, os.path.relpath(real, prefix)


def _launcher_config(limits: SandboxLimits, workdir: str, status_fd: int, uid: int) -> dict:
    hidden = [p for p in limits.hidden_paths if os.path.isdir(p)]
    prefix, relative = _python_location(limits.python)
    # bind the interpreter back read-only when a hidden directory covers it (e.g. under ~)
    expose = [prefix] if any(prefix == h or prefix.startswith(h.rstrip("/") + "/") for h in hidden) else []
    return {
        "status_fd": status_fd,
        "workdir": workdir,
        "sandbox_dir": "/tmp/sandbox",
        "stdin_path": os.path.join(workdir, ".stdin"),
        "script": "main.py",
        "python_prefix": prefix,
        "python_relative": relative,
        "hidden_paths": hidden,
        "expose_paths": expose,
        "uid": uid,
        # tuples arrive as JSON lists
        **{key: getattr(limits, key) for key in ("python", "python_flags", "namespaces", "require_isolation",
                                                 "tmpfs_bytes", "cpu_seconds", "address_space_bytes",
                                                 "max_processes", "file_size_bytes", "max_open_files")},
    }


# process-wide on purpose: the uids of the runs of every run_many call's threads
_LEASED_UIDS: set[int] = set()
_UID_LOCK = threading.Lock()


@contextlib.contextmanager
def _lease_uid(uid_range: tuple[int, int]) -> Iterator[int]:
    """A random uid no other run of this process holds: they would share RLIMIT_NPROC and the weaker mode's
    per-uid cleanup (other processes draw independently: SANDBOX.md gives the odds)."""
    low, high = uid_range
    with _UID_LOCK:
        if sum(low <= leased < high for leased in _LEASED_UIDS) >= high - low:
            raise RuntimeError(f"SandboxLimits.uid_range {uid_range} has no free uid; widen it")
        uid = random.randrange(low, high)
        while uid in _LEASED_UIDS:
            uid = random.randrange(low, high)
        _LEASED_UIDS.add(uid)
    try:
        yield uid
    finally:
        with _UID_LOCK:
            _LEASED_UIDS.discard(uid)


def _unavailable(fields: dict, limits: SandboxLimits, uid: int, returncode: int | None,
                 verdict: str | None, stderr: str) -> str | None:
    """Why this run says the sandbox cannot run programs at all, or None when the program ran."""
    if "namespaces_refused" in fields:
        refused = fields["namespaces_refused"]
        why = "; ".join(f"{name}: {reason}" for name, reason in refused.items())
        return (f"the code sandbox cannot isolate programs: the kernel refused the {', '.join(refused)} "
                f"namespace(s) ({why}), as it does for root without CAP_SYS_ADMIN, e.g. in a default Docker "
                f"container. Fix: run on a VM or bare-metal host, or in a container with CAP_SYS_ADMIN (Docker: "
                f"--cap-add SYS_ADMIN, and --security-opt apparmor=unconfined where AppArmor confines "
                f"containers); or accept the weaker uid-only mode, which does not isolate the network and lets "
                f"programs read world-readable files, with {_OPT_IN}. What each mode protects: {_DOC}")
    if "exec_error" in fields:
        return (f"the code sandbox could not start the interpreter {limits.python} as its throwaway uid "
                f"{uid}: {fields['exec_error']}. Fix: set SandboxLimits.python to an interpreter every user "
                f"may execute (e.g. /usr/bin/python3), or check its installation's permissions ({_DOC}).")
    if "setup_error" in fields:
        return f"the code sandbox could not set up a run: {fields['setup_error']} (what it needs: {_DOC})"
    if "exit_code" not in fields and verdict is None:
        return (f"the sandbox launcher exited with code {returncode} without the program's result; "
                f"last output: {stderr[-500:]!r}")
    return None


class _Run:
    """One launched sandbox: pumps its pipes, enforces wall time and output cap, kills it."""

    def __init__(self, limits: SandboxLimits, workdir: str, uid: int) -> None:
        self.limits = limits
        self.uid = uid
        status_r, status_w = os.pipe()
        cfg = _launcher_config(limits, workdir, status_w, uid)
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
                    self.child_pid = self.status_fields().get("child_pid")
                elif len(self.out["stdout"]) + len(self.out["stderr"]) > self.limits.output_bytes:
                    verdict = verdict or "output_limit"
                    self.kill()
        sel.close()
        return verdict

    def kill(self) -> None:
        """Kill the sandbox's PID 1, taking its PID namespace down (the launcher still waits on it, so the pid
        is not reused); without one, kill the group and, from here, the run's uid."""
        if self.child_pid is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # already gone
                os.kill(self.child_pid, signal.SIGKILL)
        else:
            self.kill_group()
            subprocess.run([sys.executable, "-I", "-S", str(_LAUNCHER), json.dumps({"kill_uid": self.uid})],
                           env={}, check=False, stdin=subprocess.DEVNULL, capture_output=True)

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def status_fields(self) -> dict:
        """The launcher's JSON status lines, merged (a line still being written is left out)."""
        fields: dict = {}
        for line in self.out["status"].decode(errors="replace").splitlines():
            if line.startswith("{") and line.endswith("}"):
                fields.update(json.loads(line))
        return fields


def _classify(verdict: str | None, fields: dict, stderr: str, limits: SandboxLimits) -> str:
    if verdict:
        return verdict
    code = fields["exit_code"]
    if code == 0:
        return "ok"
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and (fields.get("cpu_time") or 0) >= limits.cpu_seconds):
        return "cpu_limit"
    if code < 0:
        return "killed"
    return "memory_error" if "MemoryError" in stderr else "runtime_error"


def run_code(code: str, stdin: str | bytes | None = None, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `code` as `main.py` in a fresh sandbox; raises SandboxUnavailableError where none can run."""
    limits = limits or SandboxLimits()
    if os.geteuid() != 0:
        raise SandboxUnavailableError(
            f"the code sandbox needs root, to create namespaces and to run each program under a throwaway "
            f"uid; this process runs as uid {os.geteuid()}. Without the uid switch a program would run as "
            f"you and could read your processes' environments (/proc/PID/environ) and signal them, so no "
            f"mode runs without root. Fix: train as root on a VM or in a container (see {_DOC}).")
    workdir = tempfile.mkdtemp(prefix="hybridrl-sandbox-", dir=limits.work_root)
    start = time.monotonic()
    try:
        Path(workdir, "main.py").write_text(code)
        data = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
        Path(workdir, ".stdin").write_bytes(data)
        os.chmod(workdir, 0o755)
        with _lease_uid(limits.uid_range) as uid:
            run = _Run(limits, workdir, uid)
            try:
                verdict = run.pump()
            finally:
                run.kill_group()  # nothing of this run may outlive it
                run.proc.wait()
                os.close(run.status_r)
        fields = run.status_fields()
        stdout = run.out["stdout"][: limits.output_bytes].decode(errors="replace")
        stderr = run.out["stderr"][: limits.output_bytes].decode(errors="replace")
        reason = _unavailable(fields, limits, uid, run.proc.returncode, verdict, stderr)
        if reason:
            raise SandboxUnavailableError(reason)
        max_rss = fields.get("max_rss_kb")
        return SandboxResult(status=_classify(verdict, fields, stderr, limits), stdout=stdout, stderr=stderr,
                             exit_code=fields.get("exit_code"), wall_time=time.monotonic() - start,
                             cpu_time=fields.get("cpu_time"),
                             max_rss=None if max_rss is None else max_rss * 1024,
                             isolation=fields.get("isolation", {}))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_many(
    jobs: Sequence[tuple[str, str | bytes | None]], limits: SandboxLimits | None = None
) -> list[SandboxResult]:
    """Run `(code, stdin)` jobs, at most `limits.max_workers` at a time; results keep the input order."""
    limits = limits or SandboxLimits()
    with ThreadPoolExecutor(max_workers=limits.max_workers) as pool:
        return list(pool.map(lambda job: run_code(job[0], job[1], limits), jobs))


# checks the sandbox's promises: reads stdin, tries the environment of every ancestor it can see
_PROBE = """
import os, sys
leaks, pid = [], os.getppid()
while pid > 1:
    try:
        if open(f"/proc/{pid}/environ", "rb").read():
            leaks.append(pid)
    except OSError:
        pass
    try:
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        break
print(sys.stdin.read()[::-1], leaks)
"""


@functools.cache
def _probe(limits: SandboxLimits) -> tuple[str | None, dict[str, bool]]:
    try:
        result = run_code(_PROBE, "olleh", limits)
    except SandboxUnavailableError as err:
        return str(err), {}
    if result.stdout.split() != ["hello", "[]"]:
        if result.status == "ok" and result.stdout.split()[:1] == ["hello"]:
            return (f"a sandboxed program could read the environment of host processes "
                    f"{result.stdout.split(maxsplit=1)[1]} through /proc/PID/environ; see {_DOC}"), result.isolation
        return (f"a probe program did not run in the code sandbox: status {result.status}, exit code "
                f"{result.exit_code}, output {(result.stdout + result.stderr)[-500:]!r}; see {_DOC}"), result.isolation
    return None, result.isolation


def sandbox_available(limits: SandboxLimits | None = None) -> str | None:
    """None when the sandbox runs programs here with `limits` (probed once per process), else why not."""
    return _probe(limits or SandboxLimits())[0]


def require_sandbox(limits: SandboxLimits | None = None) -> dict[str, bool]:
    """The namespaces runs get here (fewer in the weaker mode); raises SandboxUnavailableError otherwise."""
    reason, isolation = _probe(limits or SandboxLimits())
    if reason:
        raise SandboxUnavailableError(reason)
    return isolation
