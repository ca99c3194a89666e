"""The README's commands are what CI runs, and the package metadata keeps pip on the CPU torch."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_ci_runs_the_readme_test_commands_verbatim():
    test_commands = [c for c in _readme_commands() if "pytest" in c]
    assert len(test_commands) == 2, test_commands  # the suite (after the install), then the learning tests
    assert test_commands[0].startswith("python3 -m venv .venv") and test_commands[1].endswith("pytest -m learning")
    ci_script = (ROOT / ".ci" / "run").read_text()
    assert all(command in ci_script for command in test_commands)


def test_readme_main_job_command_installs_before_running():
    main = [c for c in _readme_commands() if "python -m hybridrl." in c and "pytest" not in c]
    assert main and main[0].startswith("python3 -m venv .venv && .venv/bin/pip install -e .")


def test_torch_requirement_stops_below_the_next_release():
    # A regex, not tomllib: the package supports Python 3.10, which has no tomllib.
    torch_req = re.search(r'^\s*"(torch[^"]*)"', (ROOT / "pyproject.toml").read_text(), flags=re.M).group(1)
    assert "<2.14" in torch_req  # 2.13.0+cpu lies on the project's machines; newer means CUDA downloads
