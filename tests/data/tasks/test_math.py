"""MATH preprocessor on hand-written files in Hendrycks' json layout and the hub's parquet layout."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridrl.data.tasks import math as math_task

FIXTURES = Path(__file__).parents[1] / "fixtures" / "MATH"


@pytest.mark.parametrize(
    "solution,expected",
    [
        (r"so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),  # nested braces
        (r"guess $\boxed{-3}$, but the answer is $\boxed{3}$.", "3"),  # the last box wins
        (r"$\boxed{\{1,2,4\}}$", r"\{1,2,4\}"),  # escaped braces are text, not grouping
        (r"$\boxed{\left\{ x \right.}$", r"\left\{ x \right."),  # an unpaired escaped brace
        (r"area $= \fbox{2}$", "2"),
        (r"$r = \boxed 2$.", "2"),  # Hendrycks' '\boxed 2' form runs to the closing $
        (r"$\boxed{a}$ then $\fbox{b}$", "b"),
        (r"$\boxed{1$", None),  # unbalanced
        ("no box at all", None),
    ],
)
def test_last_boxed(solution, expected):
    assert math_task.last_boxed(solution) == expected


def test_hendrycks_json_layout(tmp_path, caplog):
    with caplog.at_level("WARNING"):
        math_task.main(["--input", str(FIXTURES), "--out", str(tmp_path)])
    train = pq.read_table(tmp_path / "train.parquet").to_pylist()
    test = pq.read_table(tmp_path / "test.parquet").to_pylist()
    # files are read in path order: algebra/1, algebra/2, number_theory/1, number_theory/2 (no box)
    assert [r["reward_model"]["ground_truth"] for r in train] == [r"\frac{1}{2}", "3", r"\{1,2,4\}"]
    assert [r["reward_model"]["ground_truth"] for r in test] == ["2", "2", r"\left(1, {-1}\right)"]
    assert "skipped 1 of 4" in caplog.text
    row = train[0]
    raw = json.loads((FIXTURES / "train" / "algebra" / "1.json").read_text())
    assert row["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
    assert row["prompt"][0]["content"] == raw["problem"] + " " + math_task.INSTRUCTION
    info = row["extra_info"]
    assert (info["question"], info["answer"], info["level"], info["type"]) == (
        raw["problem"], raw["solution"], "Level 1", "Algebra",
    )  # fmt: skip
    assert [r["extra_info"]["index"] for r in train] == [0, 1, 2]


def test_hub_parquet_layout(tmp_path):
    src = tmp_path / "src" / "data"
    src.mkdir(parents=True)
    for split in ("train", "test"):
        rows = [json.loads(p.read_text()) for p in sorted((FIXTURES / split).rglob("*.json"))]
        pq.write_table(pa.Table.from_pylist(rows), src / f"{split}-00000-of-00001.parquet")
    math_task.main(["--input", str(tmp_path / "src"), "--out", str(tmp_path / "out")])
    test = pq.read_table(tmp_path / "out" / "test.parquet").to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in test] == ["2", "2", r"\left(1, {-1}\right)"]


def test_missing_column_names_the_file(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"problem": "p", "solution": "$\\\\boxed{1}$"}\n')
    (tmp_path / "test.jsonl").write_text('{"problem": "p", "solution": "s", "level": "1", "type": "t"}\n')
    with pytest.raises(KeyError, match=r"train\.jsonl:1.*\['level', 'type'\]"):
        math_task.main(["--input", str(tmp_path), "--out", str(tmp_path / "out")])
