"""benchmarks/packed_linear.py: its quick run measures both paths and finds what the module promises."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import packed_linear  # noqa: E402

from hybridrl.models.onednn_linear import packing_supported  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.skipif(not packing_supported(torch.zeros(2, 2, dtype=torch.bfloat16)),
                    reason="no packed oneDNN bf16 linear here (x86-64 CPUs with oneDNN and bf16 kernels)")
def test_the_quick_run_writes_both_tables_with_bf16_bit_equal_and_the_same_tokens(tmp_path):
    out = tmp_path / "packed.md"
    threads = torch.get_num_threads()
    try:
        packed_linear.main(["--quick", "--threads", "1", "--dtypes", "bfloat16,float32", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    lines = out.read_text().splitlines()
    linear = [line.split(" | ") for line in lines if re.match(r"\| \d+ x \d+ x \d+ \|", line)]
    generation = [line.split(" | ") for line in lines if line.startswith("| 1m")]
    assert len(linear) == 2 * len(packed_linear.SHAPES)
    assert all(row[-1] == "yes |" for row in linear if row[1] == "bfloat16")  # the same arithmetic in bf16
    assert [row[1] for row in generation] == ["bfloat16", "float32"]
    assert all(row[6] == "yes" for row in generation)  # the engine sampled the same tokens packed and plain
    bf16_gap = float(generation[0][7].rstrip(" |"))
    assert bf16_gap == 0.0
