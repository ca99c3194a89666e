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


@pytest.fixture(scope="session")
def quickstart_sft(tmp_path_factory) -> tuple[Path, Path]:
    """The quickstart's task data and SFT warm start, made by its own functions: (data dir, HF model dir).

    ~2 minutes on 2 idle cores; shared by the slow SFT and RL learning tests.
    """
    from hybridrl import quickstart

    workdir = tmp_path_factory.mktemp("quickstart")
    data = quickstart.prepare_data(workdir)
    return data, quickstart.warm_start(workdir, data, quickstart.prepare_base_model(workdir))
