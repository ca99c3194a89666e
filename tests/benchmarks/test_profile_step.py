"""benchmarks/profile_step.py on the CPU: it records the last of its steps and reports that step's ops."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import profile_step  # noqa: E402

pytestmark = pytest.mark.slow


def test_the_last_step_is_recorded_and_reported(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "profile.md"
    profile_step.main(["--device", "cpu", "--size", "10m", "--prompts", "2", "--steps", "2", "--rows", "5",
                       "--workdir", str(tmp_path / "work"), "--out", str(out)])
    text = out.read_text()
    assert "step 2 of 2 recorded" in text
    ops = int(re.search(r"Host ops \(aten::\*\) in the step: (\d+) calls", text).group(1))
    assert ops > 1000  # a forward, a backward and 64 decoding steps of a 10-layer model
    # the trainer's stages are named ranges of the trace, and one step's worth of them was recorded
    ranges = re.search(r"ranges of the trace \(host seconds under the profiler, calls\): (.*)", text).group(1)
    assert re.search(r"\bupdate_actor [0-9.]+ \(1\)", ranges) and re.search(r"\bgen [0-9.]+ \(1\)", ranges), ranges
    assert '"update_actor":' in text and "By host time" in text and "By device time" not in text
