"""Fixtures for trainer tests (the arithmetic task, `arithmetic_data`, is in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def quickstart_sft(tmp_path_factory) -> tuple[Path, Path]:
    """The quickstart's task data and SFT warm start, made by its own functions: (data dir, HF model dir).

    ~2 minutes on 2 idle cores; shared by the slow SFT and RL learning tests.
    """
    from hybridrl import quickstart

    workdir = tmp_path_factory.mktemp("quickstart")
    data = quickstart.prepare_data(workdir)
    return data, quickstart.warm_start(workdir, data, quickstart.prepare_base_model(workdir))
