"""Helpers for the fault suite: the overrides of a few-second local GRPO run that a test breaks.

Importing this module also puts tests/trainer on sys.path for the trainer tests' helpers
(`ppo_config`, `tiny_run_overrides`, `FIXTURES`).
"""

from __future__ import annotations

import sys
from pathlib import Path

TRAINER_TESTS = Path(__file__).resolve().parents[1] / "trainer"
if str(TRAINER_TESTS) not in sys.path:
    sys.path.insert(0, str(TRAINER_TESTS))

from ppo_helpers import FIXTURES, ppo_config, tiny_run_overrides  # noqa: E402

__all__ = ["FIXTURES", "fault_run_overrides", "ppo_config", "tiny_run_overrides"]


def fault_run_overrides(data: Path, model: Path, run_dir: Path) -> list[str]:
    """A few-second GRPO run in this process (trainer.backend=local), logging to run_dir/metrics.jsonl."""
    return [*tiny_run_overrides(data, model, run_dir), "trainer.backend=local", "trainer.n_gpus_per_node=1",
            "trainer.total_training_steps=2"]
