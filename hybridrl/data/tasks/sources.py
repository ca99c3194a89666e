"""What the task commands share: the row layout, the parquet writer, the CLI flags, and reading `--input`,
searched recursively for jsonl, json or parquet files whose name or a folder starts with `train` / `test`.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

logger = logging.getLogger(__name__)

SPLITS = ("train", "test")


def make_row(*, data_source: str, question: str, ground_truth: Any, answer: str, split: str, index: int,
             extra: dict[str, Any] | None = None, prompt_text: str | None = None) -> dict[str, Any]:
    """One row in verl's schema, prompting with `prompt_text` (default `question`). `extra` adds keys to
    `extra_info`, the same for every row of a file (parquet stores it as one struct type)."""
    extra_info = {"split": split, "index": index, "question": question, "answer": answer, **(extra or {})}
    return {"data_source": data_source,
            "prompt": [{"role": "user", "content": question if prompt_text is None else prompt_text}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": ground_truth},
            "extra_info": extra_info}


def write_parquet(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Write rows to one parquet file; an empty list is refused since no trainer can use it."""
    if not rows:
        raise ValueError(f"refusing to write {path}: no rows (raise --train-size/--test-size or check "
                         f"--input)")
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows)), path)
    logger.info("wrote %d rows to %s", len(rows), path)


def write_splits(out_dir: str | Path, train_rows: Sequence[dict], test_rows: Sequence[dict]) -> None:
    """Write `out_dir/train.parquet` and `out_dir/test.parquet`."""
    out = Path(out_dir).expanduser()
    write_parquet(train_rows, out / "train.parquet")
    write_parquet(test_rows, out / "test.parquet")


def base_parser(description: str, *, train_size: int | None,
                test_size: int | None) -> argparse.ArgumentParser:
    """The flags every task command shares; sizes of None mean every input row."""
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
        raise ValueError(f"--train-size + --test-size = {train_size + test_size} exceeds the {available} "
                         f"distinct instances this configuration has; lower the sizes or allow more "
                         f"digits/numbers")


SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class Record:
    """One input row and where it came from, so errors can point at it."""

    fields: dict[str, Any]
    source: str  # "path:line" or "path:row"


def _split_of(path: Path, root: Path) -> str | None:
    for part in path.relative_to(root).parts:
        head = part.split("-")[0].split(".")[0].split("_")[0].lower()
        if head in SPLITS:
            return head
    return None


def find_split_files(root: str | Path) -> dict[str, list[Path]]:
    """Map each split to its files under `root`, sorted by path so the row order is reproducible."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"--input {root} is not a directory; point it at the downloaded data set")
    found: dict[str, list[Path]] = {split: [] for split in SPLITS}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in SUFFIXES):
        split = _split_of(path, root)
        if split is not None:
            found[split].append(path)
    missing = [split for split, paths in found.items() if not paths]
    if missing:
        raise FileNotFoundError(f"no {' or '.join(missing)} files under {root}: expected names like "
                                f"train.jsonl, test-00000-of-00001.parquet or train/<subject>/<n>.json "
                                f"(suffixes {', '.join(SUFFIXES)})")
    return found


def read_file(path: Path) -> Iterable[Record]:
    """Rows of one jsonl, json (a single object, or a list of objects) or parquet file."""
    if path.suffix == ".parquet":
        for i, row in enumerate(pq.read_table(path).to_pylist()):
            yield Record(row, f"{path}:row {i}")
    elif path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if line.strip():
                    yield Record(_loads(line, f"{path}:{lineno}"), f"{path}:{lineno}")
    else:
        data = _loads(path.read_text(encoding="utf-8"), str(path))
        for i, row in enumerate(data if isinstance(data, list) else [data]):
            yield Record(row, f"{path}:item {i}")


def _loads(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not valid JSON ({err.msg})") from err


def read_split(paths: Sequence[Path], required: Sequence[str]) -> list[Record]:
    """All rows of a split's files; a row missing a required column is an error naming the file."""
    records = [rec for path in paths for rec in read_file(path)]
    for rec in records:
        missing = [col for col in required if col not in rec.fields]
        if missing:
            raise KeyError(f"{rec.source}: missing column(s) {missing}; this preprocessor expects "
                           f"{list(required)} (found {sorted(rec.fields)})")
    return records


def preprocess_main(description: str, required: Sequence[str],
                    to_rows: Callable[[list[Record], str], list[dict[str, Any]]],
                    argv: Sequence[str] | None = None) -> None:
    """A preprocessor's command: `to_rows(records, split)` converts each split of `--input` to rows, of which
    the first `--train-size` / `--test-size` are written to `--out`."""
    parser = base_parser(description, train_size=None, test_size=None)
    parser.add_argument("--input", required=True, help="directory with the data set's train/test files")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    files = find_split_files(args.input)
    train = to_rows(read_split(files["train"], required), "train")[: args.train_size]
    test = to_rows(read_split(files["test"], required), "test")[: args.test_size]
    write_splits(args.out, train, test)
