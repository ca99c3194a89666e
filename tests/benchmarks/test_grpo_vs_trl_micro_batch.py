"""grpo_vs_trl.py's --micro-batch: both frameworks' pass size, checked before anything is built, and kept
apart from the default's logs and rows."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import grpo_vs_trl as bench  # noqa: E402  (a script beside the package, not part of it)


def test_a_micro_batch_that_does_not_divide_a_steps_samples_is_refused_before_any_model_is_built(tmp_path):
    with pytest.raises(SystemExit, match=r"--micro-batch 48 must divide .*10m \(128\), 50m \(64\)"):
        bench.main(["--sizes", "10m,50m", "--micro-batch", "48", "--workdir", str(tmp_path)])
    with pytest.raises(SystemExit, match="--micro-batch 0 must divide"):
        bench.main(["--sizes", "10m", "--micro-batch", "0", "--workdir", str(tmp_path)])
    assert not list(tmp_path.glob("base_*")) and not (tmp_path / "data").exists()


def test_another_micro_batch_gets_its_own_logs_and_rows():
    w = bench.Workload(size="10m", model="m", start="untrained", data="d", prompts=16, n=8, response_length=64,
                       steps=6, warmup=2, evaluate=False, dtype="bfloat16")
    assert w.micro_batch == bench.DEFAULT_MICRO_BATCH and w.tag == "10m-bfloat16"  # earlier runs' files
    assert dataclasses.replace(w, micro_batch=128).tag == "10m-bfloat16-mb128"
