"""Run verl's own CPU unit tests for DataProto and core_algos against hybridrl.

    python compat/run_verl_tests.py [--verl-version 0.9.1] [--keep DIR] [--show-failures]

Steps: download verl's source distribution with pip into a temporary directory (nothing of verl is kept
in this repository or installed), unpack its tests, make sure `tensordict` can be imported (verl's
protocol tests import it at the top; it is installed into the temporary directory when missing), and
run each test file in its own pytest process with the renaming shim `verl_shim.py`. Prints one row per
file and, last, `verl tests passed: P/T`. Exits 0 whatever the count: the count is the result.

Each file gets its own process because verl's registry tests rebind the estimator registry of the
module they test and never restore it; sharing a process would let that leak into later files.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

COMPAT_DIR = Path(__file__).resolve().parent
REPO_ROOT = COMPAT_DIR.parent

# verl's CPU tests of DataProto (verl/protocol.py) and of core_algos and the helpers its losses use.
# Left out on purpose: tests/test_protocol_v2_on_cpu.py tests verl's TensorDict-based replacement for
# DataProto (verl/utils/tensordict_utils.py), which hybridrl does not implement; and, of the
# tests/trainer/ppo/*_on_cpu.py files, test_metric_utils, test_rollout_moe_lb_metrics and
# test_spec_decode_metrics, which test verl's trainer metrics, not DataProto or core_algos.
TEST_FILES = [
    "tests/test_protocol_on_cpu.py",
    "tests/trainer/ppo/test_core_algos_on_cpu.py",
    "tests/trainer/ppo/test_dynamic_policy_losses_on_cpu.py",
    "tests/trainer/ppo/test_loss_aggregation_on_cpu.py",
    "tests/trainer/ppo/test_reinforce_pp_multiturn_on_cpu.py",
    "tests/trainer/ppo/test_value_loss_normalization_on_cpu.py",
    "tests/trainer/ppo/test_rollout_corr_integration.py",
    "tests/trainer/test_multi_trajectories_advantage_on_cpu.py",
]

# verl's protocol tests need tensordict >= 0.10 (their to/from_tensordict tests skip below that).
TENSORDICT_REQUIREMENTS = ["tensordict>=0.10", "pyvers>=0.2,<0.3", "cloudpickle"]


@dataclass
class FileResult:
    path: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (test id, first line of the error)

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped


# Tests per file in verl 0.9.1, after parametrisation: a file that fails to import counts as that many
# failures, so the total stays comparable between runs.
EXPECTED_TESTS = dict(zip(TEST_FILES, [38, 23, 1, 6, 6, 26, 11, 2], strict=True))


def pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"pip {' '.join(args)} failed:\n{done.stderr}")


def fetch_verl_tests(version: str, workdir: Path) -> Path:
    """Download verl's sdist and unpack only its tests/ folder; returns the unpacked root."""
    download = workdir / "sdist"
    if not list(download.glob("verl-*.tar.gz")):  # --keep reuses an earlier download
        pip("download", "--no-deps", "--no-binary", ":all:", f"verl=={version}", "-d", str(download))
    (archive,) = download.glob("verl-*.tar.gz")
    root = workdir / "verl_tests"
    with tarfile.open(archive) as tar:
        prefix = f"verl-{version}/tests/"
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
        tar.extractall(root, members=members, filter="data")
    return root / f"verl-{version}"


def tensordict_path(workdir: Path) -> str | None:
    """A directory to put on PYTHONPATH so that tensordict imports, or None when it already does."""
    probe = subprocess.run([sys.executable, "-c", "import tensordict"], capture_output=True)
    if probe.returncode == 0:
        return None
    target = workdir / "deps"
    pip("install", "--no-deps", "--target", str(target), *TENSORDICT_REQUIREMENTS)
    return str(target)


def run_file(verl_root: Path, test_file: str, workdir: Path, extra_path: list[str]) -> FileResult:
    report = workdir / (test_file.replace("/", "_") + ".xml")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(COMPAT_DIR), *extra_path, str(REPO_ROOT),
                                         env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "pytest", "-p", "verl_shim", "-p", "no:cacheprovider", "-q",
               "--rootdir", str(verl_root), "-c", os.devnull, f"--junitxml={report}", test_file]
    # cwd is the temporary unpacked tree: verl's tests write files into it (test_torch_save_data_proto)
    subprocess.run(command, cwd=verl_root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return parse_report(test_file, report)


def parse_report(test_file: str, report: Path) -> FileResult:
    result = FileResult(test_file)
    if not report.exists():
        result.failures.append((test_file, "pytest wrote no report"))
        return result
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if not case.get("classname"):  # the file itself failed to import: none of its tests ran
            result.failed += EXPECTED_TESTS.get(test_file, 1)
            result.failures.append((test_file, "collection failed: " + _first_line(case)))
            continue
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if case.find("skipped") is not None:
            result.skipped += 1
        elif problem is not None:
            result.failed += 1
            result.failures.append((name, _first_line(case)))
        else:
            result.passed += 1
    return result


def _first_line(case: ET.Element) -> str:
    problem = case.find("failure") if case.find("failure") is not None else case.find("error")
    if problem is None:
        return ""
    # for an import error the useful line is the traceback's last one (the exception)
    text = (problem.text if not case.get("classname") else problem.get("message") or problem.text) or ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    line = (lines[-1] if not case.get("classname") else lines[0]) if lines else ""
    return line.strip()[:200]


def print_table(results: list[FileResult], show_failures: bool) -> None:
    width = max(len(r.path) for r in results)
    print(f"{'file':<{width}}  passed  failed  skipped  total")
    for r in results:
        print(f"{r.path:<{width}}  {r.passed:>6}  {r.failed:>6}  {r.skipped:>7}  {r.total:>5}")
    if show_failures:
        for r in results:
            for name, message in r.failures:
                print(f"FAILED {name}: {message}")
    passed = sum(r.passed for r in results)
    total = sum(r.total for r in results)
    print(f"verl tests passed: {passed}/{total}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verl-version", default="0.9.1")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it (default: a temp dir)")
    parser.add_argument("--show-failures", action="store_true", help="list each failing test")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="verl_compat_") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        verl_root = fetch_verl_tests(args.verl_version, workdir)
        extra = [p for p in [tensordict_path(workdir)] if p]
        results = [run_file(verl_root, f, workdir, extra) for f in TEST_FILES]
    print_table(results, args.show_failures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
