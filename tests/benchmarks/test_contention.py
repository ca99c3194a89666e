"""contention.py: the runs alone alternate the policies, and the table's ratios are against the adaptive
runs alone (hand-computed below)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import contention  # noqa: E402  (a script beside the package, not part of it)


def test_policies_alternate_alone_then_every_neighbour_kind_then_the_workloads_own_pairs():
    sft, _, ray, _ = contention.workloads(Path("data"), Path("model"), steps=12)
    alone = [("adaptive", "alone"), ("fixed", "alone"), ("fixed + passive wait", "alone")]
    contended = [("adaptive", "1 Python loop"), ("adaptive", "2 Python loops"), ("adaptive", "torch 2-thread matmul")]
    assert contention.plan(sft, repeats=2) == [*alone, *alone, *contended, ("fixed", "1 Python loop"),
                                               ("fixed + passive wait", "1 Python loop")]
    assert contention.plan(ray, repeats=3) == [("adaptive", "alone"), *contended]


def _run(step: float, gen: float | None = None) -> dict:
    return {"step": step, "gen": gen, "steps": 10, "refitted": False}


def test_the_table_divides_by_the_median_of_the_adaptive_runs_alone():
    runs = [("adaptive", "alone", _run(1.0, 0.4)), ("fixed", "alone", _run(1.1)), ("adaptive", "alone", _run(1.2)),
            ("fixed", "alone", _run(0.9)), ("adaptive", "alone", _run(1.4)),
            ("adaptive", "1 Python loop", {**_run(3.0, 1.5), "refitted": True})]
    table = contention.report({"GRPO local": runs}, "python benchmarks/contention.py")
    assert "| adaptive | alone | 1.200 (1.000-1.400) | 1.00 | 0.400 | 3 | no |" in table
    assert "| fixed | alone | 1.000 (0.900-1.100) | 0.83 | - | 2 | no |" in table
    assert "| adaptive | 1 Python loop | 3.000 | 2.50 | 1.500 | 1 | yes |" in table
    assert "Alone, adaptive against fixed: 1.200x." in table
