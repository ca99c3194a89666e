"""Fixtures for trainer tests: a small arithmetic task."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def arithmetic_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("arithmetic")
    subprocess.run([sys.executable, "-m", "hybridrl.data.tasks.arithmetic", "--out", str(out),
                    "--train-size", "64", "--test-size", "8", "--seed", "3"], check=True, capture_output=True)
    return out
