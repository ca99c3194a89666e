"""Shared pieces of the task commands: the row layout, the parquet writer and the common CLI flags."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

logger = logging.getLogger(__name__)

SPLITS = ("train", "test")


def make_row(
    *,
    data_source: str,
    question: str,
    ground_truth: Any,
    answer: str,
    split: str,
    index: int,
    ability: str = "math",
    extra: dict[str, Any] | None = None,
    prompt_text: str | None = None,
) -> dict[str, Any]:
    """One row in verl's schema; the user message of `prompt` is `prompt_text`, or `question` if None.

    `extra_info.question` keeps the bare question, as verl's preprocessors do, when the prompt adds an
    instruction to it. `extra` adds task-specific keys to `extra_info` (they must be the same for every row of a file,
    since parquet stores `extra_info` as one struct type).
    """
    extra_info: dict[str, Any] = {"split": split, "index": index, "question": question, "answer": answer}
    extra_info.update(extra or {})
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question if prompt_text is None else prompt_text}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra_info,
    }


def write_parquet(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Write rows to one parquet file; an empty list is refused since no trainer can use it."""
    if not rows:
        raise ValueError(
            f"refusing to write {path}: no rows (raise --train-size/--test-size or check --input)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows)), path)
    logger.info("wrote %d rows to %s", len(rows), path)


def write_splits(
    out_dir: str | Path, train_rows: Sequence[dict], test_rows: Sequence[dict]
) -> tuple[Path, Path]:
    """Write `out_dir/train.parquet` and `out_dir/test.parquet`; returns both paths."""
    out = Path(out_dir).expanduser()
    paths = (out / "train.parquet", out / "test.parquet")
    write_parquet(train_rows, paths[0])
    write_parquet(test_rows, paths[1])
    return paths


def base_parser(
    description: str, *, train_size: int | None, test_size: int | None
) -> argparse.ArgumentParser:
    """The flags every task command shares: --out, --seed, --train-size, --test-size.

    For the preprocessors the sizes default to None, meaning "every row of the input".
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True, help="directory for train.parquet and test.parquet")
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed, same files)")
    parser.add_argument("--train-size", type=int, default=train_size, help="number of training rows")
    parser.add_argument("--test-size", type=int, default=test_size, help="number of held-out rows")
    return parser


def check_sizes(train_size: int, test_size: int, available: int | None = None) -> None:
    """Refuse non-positive sizes, and sizes the task cannot fill with distinct instances."""
    for name, value in (("--train-size", train_size), ("--test-size", test_size)):
        if value is None or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value}")
    if available is not None and train_size + test_size > available:
        raise ValueError(
            f"--train-size + --test-size = {train_size + test_size} exceeds the {available} distinct "
            f"instances this configuration has; lower the sizes or allow more digits/numbers"
        )
