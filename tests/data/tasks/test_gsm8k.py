"""GSM8K preprocessor on hand-written files in the publisher's jsonl and the hub's parquet layout."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridrl.data.tasks import gsm8k

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gsm8k"


@pytest.mark.parametrize(
    "solution,expected",
    [
        ("so 48 + 24 = 72\n#### 72", "72"),
        ("#### 2,400", "2400"),  # thousands comma dropped
        ("#### 1,025,000.", "1025000"),  # sentence period is not part of the number
        ("#### -5", "-5"),
        ("#### 4.5", "4.5"),
        ("first #### 3 then fixed\n#### 4", "4"),  # the last marker wins
        ("no marker here 72", None),
    ],
)
def test_extract_answer(solution, expected):
    assert gsm8k.extract_answer(solution) == expected


def _read(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_jsonl_layout(tmp_path):
    gsm8k.main(["--input", str(FIXTURES), "--out", str(tmp_path)])
    train, test = _read(tmp_path / "train.parquet"), _read(tmp_path / "test.parquet")
    assert [r["reward_model"]["ground_truth"] for r in train] == ["2400", "-5", "4.5"]
    assert [r["reward_model"]["ground_truth"] for r in test] == ["72", "1025000"]
    row = test[0]
    raw = json.loads((FIXTURES / "test.jsonl").read_text().splitlines()[0])
    assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
    assert row["prompt"] == [{"role": "user", "content": raw["question"] + " " + gsm8k.INSTRUCTION}]
    assert row["extra_info"] == {
        "split": "test", "index": 0, "question": raw["question"], "answer": raw["answer"],
    }  # fmt: skip


def test_hub_parquet_layout_and_sizes(tmp_path):
    src = tmp_path / "src" / "main"
    src.mkdir(parents=True)
    for split in ("train", "test"):
        rows = [json.loads(x) for x in (FIXTURES / f"{split}.jsonl").read_text().splitlines()]
        pq.write_table(pa.Table.from_pylist(rows), src / f"{split}-00000-of-00001.parquet")
    gsm8k.main(["--input", str(tmp_path / "src"), "--out", str(tmp_path / "out"), "--train-size", "2"])
    assert [r["reward_model"]["ground_truth"] for r in _read(tmp_path / "out" / "train.parquet")] == [
        "2400",
        "-5",
    ]


def test_errors_name_file_and_column(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"question": "q", "solution": "#### 1"}\n')
    (tmp_path / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    with pytest.raises(KeyError, match=r"train\.jsonl:1.*'answer'"):
        gsm8k.main(["--input", str(tmp_path), "--out", str(tmp_path / "out")])
    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "no final line"}\n')
    with pytest.raises(ValueError, match=r"train\.jsonl:1.*####"):
        gsm8k.main(["--input", str(tmp_path), "--out", str(tmp_path / "out")])
    (tmp_path / "test.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="no test files"):
        gsm8k.main(["--input", str(tmp_path), "--out", str(tmp_path / "out")])
