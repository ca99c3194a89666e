"""benchmarks/fused_decode.py: its quick run times the three decoding settings and checks what they promise."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import fused_decode  # noqa: E402

from hybridrl.utils.device import native_bf16  # noqa: E402


@pytest.mark.slow  # ~40 s: three generations per prompt length
def test_the_quick_run_times_each_setting_and_the_fused_step_samples_the_forwards_tokens(tmp_path):
    out = tmp_path / "fused.md"
    threads = torch.get_num_threads()
    try:
        fused_decode.main(["--quick", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    rows = [line.strip("| ").split(" | ") for line in out.read_text().splitlines() if line.startswith("| 1m")]
    assert [int(row[1]) for row in rows] == [11, 47]  # the question said once and four times
    for row in rows:
        assert all(float(cell.split()[0]) > 0 for cell in row[3:6])
        assert row[6] == "yes"  # the fused step: the forward's tokens and log-probs bit for bit
        gaps = [float(cell) for cell in row[7:10]]
        if native_bf16("cpu"):  # the script's default dtype: bf16 where the CPU multiplies it natively
            # bf16 decoding of an fp32 model: every setting's log-probs are the model's to bf16 precision
            assert all(0 < gap < 0.05 for gap in gaps), gaps
        else:  # a CPU that emulates bf16 decodes in fp32: the model's log-probs up to the order of sums
            assert all(gap < 1e-4 for gap in gaps), gaps
