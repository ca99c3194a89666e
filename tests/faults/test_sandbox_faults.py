"""Faults of the code sandbox: a host that refuses namespaces, a user who is not root.

Each must end in a clear error that names the reason and the fix (never a 0.0 score), or, opted in with
`reward_model.sandbox.require_isolation=false`, in the weaker mode that really runs the program and
keeps the parent's environment unreadable. `setpriv --inh-caps=-sys_admin --bounding-set=-sys_admin`
makes the host refuse namespaces as a default Docker container does (root without CAP_SYS_ADMIN); each
probe runs in a subprocess under it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fault_helpers import fault_run_overrides

from hybridrl.rewards.sandbox import SandboxLimits

REPO = Path(__file__).resolve().parents[2]
NO_SYS_ADMIN = ["setpriv", "--inh-caps=-sys_admin", "--bounding-set=-sys_admin"]
needs_root_and_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="refusing namespaces needs root and setpriv (util-linux)",
)
DOUBLE = "n = int(input())\nprint(n * 2)"
DOUBLE_TESTS = {"inputs": ["3\n"], "outputs": ["6"]}


def _run(argv: list[str], cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=cwd, env=full_env)


def _error_line(stderr: str) -> str:
    """The exception line of a traceback (Hydra prints a hint after it)."""
    return next((line for line in stderr.splitlines() if line.startswith("hybridrl.")), stderr[-2000:])


def _python_under_setpriv(script: str, **env: str) -> subprocess.CompletedProcess:
    return _run([*NO_SYS_ADMIN, sys.executable, "-c", script], **env)


@needs_root_and_setpriv
def test_refused_namespaces_raise_the_reason_and_fix_instead_of_scoring_zero():
    script = (
        "from hybridrl.rewards.sandbox import sandbox_available\n"
        "from hybridrl.rewards.scorers import code_score\n"
        "print('REASON', sandbox_available())\n"
        f"print('SCORE', code_score({DOUBLE!r}, {json.dumps(DOUBLE_TESTS)!r}))\n"
    )
    proc = _python_under_setpriv(script)
    assert proc.returncode != 0 and "SCORE" not in proc.stdout, proc.stdout + proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("hybridrl.rewards.sandbox.SandboxUnavailableError: "), proc.stderr
    # The reason (which namespaces, refused how), the fix and the opt-in key are all in the message.
    for part in ("refused the mount, network, pid, ipc, uts namespace(s)", "Operation not permitted",
                 "CAP_SYS_ADMIN", "reward_model.sandbox.require_isolation=false", "SANDBOX.md"):
        assert part in error
    assert proc.stdout.startswith("REASON the code sandbox cannot isolate programs")


@needs_root_and_setpriv
def test_opted_in_weaker_mode_runs_programs_and_hides_the_parent_environment():
    # The secret is in the host process's initial environment, what /proc/PID/environ shows.
    program = (
        "import json, os, sys\nleaks, readable, pid = [], [], os.getppid()\n"
        "for p in filter(str.isdigit, os.listdir('/proc')):\n    try:\n"
        "        env = open(f'/proc/{p}/environ', 'rb').read()\n    except OSError:\n        continue\n"
        "    leaks += [p] if b'hunter2' in env else []\n"
        "    readable += [p] if env and int(open(f'/proc/{p}/status').read().split('Uid:')[1].split()[0]) == 0 else []\n"
        "if os.fork() == 0:\n    os.setsid()\n    import time\n    time.sleep(300)\n"  # a daemon left behind
        "open('/tmp/hybridrl-weak-leftover', 'w').write('x')\n"
        "print(json.dumps({'leaks': leaks, 'root_env_readable': readable, 'uid': os.getuid(), 'exe': sys.executable}))"
    )
    script = (
        "import json, os\nfrom pathlib import Path\n"
        "from hybridrl.rewards.sandbox import SandboxLimits, run_code, sandbox_available\n"
        "from hybridrl.rewards.scorers import code_score\n"
        "weak = SandboxLimits(require_isolation=False)\n"
        f"score = code_score({DOUBLE!r}, {json.dumps(DOUBLE_TESTS)!r}, sandbox_limits=weak)\n"
        f"result = run_code({program!r}, limits=weak)\n"
        "low, high = weak.uid_range\n"
        "alive = [p.name for p in Path('/proc').iterdir() if p.name.isdigit() and low <= p.stat().st_uid < high]\n"
        "print(json.dumps({'score': score, 'available': sandbox_available(weak), 'status': result.status,\n"
        "                  'isolation': result.isolation, 'seen': json.loads(result.stdout), 'alive': alive,\n"
        "                  'leftover': os.path.exists('/tmp/hybridrl-weak-leftover')}))\n"
    )
    proc = _python_under_setpriv(script, HYBRIDRL_FAULT_SECRET="hunter2")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["score"] == 1.0 and out["available"] is None and out["status"] == "ok"
    assert not any(out["isolation"].values())  # really the weaker mode: no namespace at all
    seen = out["seen"]
    assert seen["leaks"] == [] and seen["root_env_readable"] == [] and seen["uid"] != 0
    # The interpreter was reached: by its path, or through a handle where the throwaway uid cannot
    # search that path (a pyenv under /root, mode 0700, as on the machine these tests were written on).
    searchable = all(os.stat(d).st_mode & 0o001 for d in Path(SandboxLimits().python).parents)
    assert seen["exe"] == SandboxLimits().python if searchable else seen["exe"].startswith("/proc/self/fd/")
    assert out["alive"] == [] and out["leftover"] is False  # the daemon was killed, /tmp cleaned


def test_without_root_the_sandbox_refuses_with_the_reason(request):
    script = (
        "from hybridrl.rewards.sandbox import SandboxLimits, run_code\n"
        "run_code('print(1)', limits=SandboxLimits(require_isolation=False))\n"
    )
    if os.geteuid() == 0:
        # The test interpreter may live where an unprivileged user cannot reach it: use the system one.
        python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)
        if python is None or shutil.which("setpriv") is None:
            pytest.skip("needs setpriv and a system python3 an unprivileged user can run")
        # The checkout may sit where that user cannot read it (a mktemp clone is mode 0700): it imports a
        # copy of the package from a directory everyone can read.
        shared = Path(tempfile.mkdtemp(prefix="hybridrl-nobody-"))
        request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
        shared.chmod(0o755)
        shutil.copytree(REPO / "hybridrl", shared / "hybridrl", ignore=shutil.ignore_patterns("__pycache__"))
        for path in [shared, *shared.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-I", "-c",
                f"import sys; sys.path.insert(0, {str(shared)!r})\n" + script]
    else:
        argv = [sys.executable, "-c", script]
    proc = _run(argv, cwd=Path("/"))
    error = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and error.startswith("hybridrl.rewards.sandbox.SandboxUnavailableError: "), proc.stderr
    assert "needs root" in error and "/proc/PID/environ" in error and "SANDBOX.md" in error


def _code_data(out: Path) -> Path:
    """Code tasks in verl's parquet schema (8 train, 4 test rows), scored by the built-in code scorer."""
    out.mkdir(parents=True, exist_ok=True)
    for name, count in (("train", 8), ("test", 4)):
        rows = [{"data_source": "codecontests", "ability": "code",
                 "prompt": [{"role": "user", "content": f"Print {i} doubled."}],
                 "reward_model": {"style": "rule", "ground_truth": json.dumps({"inputs": [""], "outputs": [str(2 * i)]})},
                 "extra_info": {"index": i}} for i in range(count)]
        pq.write_table(pa.Table.from_pylist(rows), out / f"{name}.parquet")
    return out


def _train_under_setpriv(tmp_path: Path, model: Path, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    data, run_dir = _code_data(tmp_path / "code"), tmp_path / "run"
    # One step of 2 prompts x 2 samples: 4 programs to run, the least that is still a GRPO step.
    overrides = [*fault_run_overrides(data, model, run_dir), "custom_reward_function.path=null",
                 "trainer.total_training_steps=1", "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2",
                 *extra]
    proc = _run([*NO_SYS_ADMIN, sys.executable, "-m", "hybridrl.trainer.main_ppo", *overrides], cwd=tmp_path,
                HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return proc, run_dir


@pytest.mark.slow  # an entry-point run in a new process
@needs_root_and_setpriv
def test_a_run_with_code_tasks_stops_before_any_worker_when_namespaces_are_refused(tmp_path, tiny_model_dir):
    proc, run_dir = _train_under_setpriv(tmp_path, tiny_model_dir)
    assert proc.returncode != 0
    error = _error_line(proc.stderr)
    assert error.startswith("hybridrl.rewards.sandbox.SandboxUnavailableError: data sources ['codecontests'] "
                            "are scored by running programs, but the code sandbox cannot isolate programs"), proc.stderr
    assert "reward_model.sandbox.require_isolation=false" in error
    assert not run_dir.exists()  # stopped before anything was started or written


@pytest.mark.slow  # an entry-point run in a new process
@needs_root_and_setpriv
def test_an_opted_in_run_scores_code_tasks_in_the_weaker_mode(tmp_path, tiny_model_dir):
    proc, run_dir = _train_under_setpriv(tmp_path, tiny_model_dir, "reward_model.sandbox.require_isolation=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "code sandbox in the weaker uid-only mode" in proc.stdout + proc.stderr
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step = next(m for m in metrics if "critic/score/mean" in m)
    # The untrained model's responses are not programs that print 2i: each ran and failed its test.
    assert step["critic/score/mean"] == 0.0
