"""Fixtures for the fault suite: each test breaks one thing (a reward, a checkpoint, a row, the sandbox)
and asserts the run says so clearly and loses nothing already written.

`fault_data`: the arithmetic task in verl's parquet schema (64 train rows, 8 test rows).
`fault_run_overrides(data, model, run_dir)`: a few-second GRPO run on the local backend (the trainer
tests' `tiny_run_overrides`), to which a test adds the fault it probes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TRAINER_TESTS = Path(__file__).resolve().parents[1] / "trainer"
sys.path.insert(0, str(TRAINER_TESTS))  # the trainer tests' helpers (ppo_config, tiny_run_overrides)

from ppo_helpers import FIXTURES, ppo_config, tiny_run_overrides  # noqa: E402

__all__ = ["FIXTURES", "fault_run_overrides", "ppo_config"]


def fault_run_overrides(data: Path, model: Path, run_dir: Path) -> list[str]:
    """A few-second GRPO run in this process (trainer.backend=local), logging to run_dir/metrics.jsonl."""
    return [*tiny_run_overrides(data, model, run_dir), "trainer.backend=local", "trainer.n_gpus_per_node=1",
            "trainer.total_training_steps=2"]


@pytest.fixture(scope="session")
def fault_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fault_arithmetic")
    subprocess.run([sys.executable, "-m", "hybridrl.data.tasks.arithmetic", "--out", str(out),
                    "--train-size", "64", "--test-size", "8", "--seed", "3"], check=True, capture_output=True)
    return out
