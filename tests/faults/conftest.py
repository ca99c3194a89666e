"""Fixtures for the fault suite: each test breaks one thing (a reward, a checkpoint, a row, the sandbox)
and asserts the run says so clearly and loses nothing already written.

`fault_data`: the arithmetic task in verl's parquet schema (64 train rows, 8 test rows). The run
overrides a test adds its fault to are in `fault_helpers.fault_run_overrides` (a conftest is not
importable by name: pytest may resolve `conftest` to another folder's).
"""

from __future__ import annotations

from pathlib import Path

import fault_helpers  # noqa: F401 - puts tests/trainer on sys.path for the test modules' imports
import pytest


@pytest.fixture(scope="session")
def fault_data(arithmetic_data: Path) -> Path:
    return arithmetic_data
