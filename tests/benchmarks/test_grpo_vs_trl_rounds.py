"""grpo_vs_trl.py's --rounds: a runner's alternating rounds on one workload become one row of medians over
every round's timed steps (hand-computed below), and the table shows each round's own median."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import grpo_vs_trl as bench  # noqa: E402  (a script beside the package, not part of it)

WORKLOAD = bench.Workload(size="10m", model="m", start="untrained", data="d", prompts=4, n=8, response_length=64,
                          steps=6, warmup=2, evaluate=False, dtype="bfloat16")


def round_row(kept: list[list[float]], rss: float, acc: float | None = None) -> dict:
    step_s = sorted(s for s, _ in kept)[len(kept) // 2]
    return {"runner": "hybridrl-local", "size": "10m", "dtype": "bfloat16", "start": "untrained", "steps": 6,
            "timed": len(kept), "step_s": step_s, "kept": kept, "tokens_per_s": 0.0,
            "samples_per_s": WORKLOAD.samples / step_s, "root_rss_gb": rss, "tree_pss_gb": rss + 1,
            "acc_before": None if acc is None else 0.5, "acc_after": acc, "score_last": None, "wall_s": 10.0,
            "raw": {}, "params": 10_000_000}


def test_one_round_is_the_row_itself():
    row = round_row([[2.0, 100.0], [3.0, 90.0], [4.0, 80.0]], rss=1.0)
    assert bench.merge_rounds([row], WORKLOAD) is row


def test_rounds_pool_their_timed_steps():
    first = round_row([[2.0, 100.0], [4.0, 100.0], [2.2, 110.0]], rss=1.0, acc=0.7)
    second = round_row([[3.0, 150.0], [3.4, 170.0]], rss=1.5, acc=0.8)
    merged = bench.merge_rounds([first, second], WORKLOAD)
    # pooled step times 2.0, 2.2, 3.0, 3.4, 4.0: median 3.0; tokens/s 50, 25, 50, 50, 50: median 50
    assert merged["step_s"] == pytest.approx(3.0)
    assert merged["tokens_per_s"] == pytest.approx(50.0)
    assert merged["samples_per_s"] == pytest.approx(32 / 3.0)
    assert merged["timed"] == 5 and merged["round_step_s"] == [2.2, 3.4]
    assert merged["root_rss_gb"] == 1.5 and merged["tree_pss_gb"] == 2.5  # the larger peak
    assert merged["acc_after"] == pytest.approx(0.75)
    assert merged["wall_s"] == 20.0


def test_the_table_shows_each_rounds_median():
    merged = bench.merge_rounds([round_row([[2.0, 100.0]], rss=1.0), round_row([[3.0, 100.0]], rss=1.0)], WORKLOAD)
    trl = {**round_row([[5.0, 100.0]], rss=1.0), "runner": "trl"}
    text = bench.table([trl, merged], [WORKLOAD], "header")
    line = next(line for line in text.splitlines() if "hybridrl-local" in line)
    assert "| 2 x 6 (2) | 2.50 (2.00, 3.00) |" in line
    assert "| 2.00x |" in line  # 12.8 samples/s against TRL's 6.4
