"""Reading the public data sets' local files, in the layouts their publishers distribute.

`--input DIR` is searched recursively for files whose name or parent folder starts with `train` or
`test`: GitHub jsonl (`train.jsonl`), Hugging Face hub parquet (`main/train-00000-of-00001.parquet`)
and Hendrycks' MATH release (`MATH/train/algebra/1.json`, one JSON object per file) all fit.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from hybridrl.data.tasks.writer import SPLITS, base_parser, write_splits

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
        raise FileNotFoundError(
            f"no {' or '.join(missing)} files under {root}: expected names like train.jsonl, "
            f"test-00000-of-00001.parquet or train/<subject>/<n>.json (suffixes {', '.join(SUFFIXES)})"
        )
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
            raise KeyError(
                f"{rec.source}: missing column(s) {missing}; this preprocessor expects {list(required)} "
                f"(found {sorted(rec.fields)})"
            )
    return records


def preprocess_main(
    description: str,
    required: Sequence[str],
    to_rows: Callable[[list[Record], str], list[dict[str, Any]]],
    argv: Sequence[str] | None = None,
) -> None:
    """The command of a preprocessor: read `--input`'s train/test files, convert, write `--out`.

    `to_rows(records, split)` turns one split's records into verl-schema rows (it may skip records);
    `--train-size` / `--test-size` then keep the first rows of each split.
    """
    parser = base_parser(description, train_size=None, test_size=None)
    parser.add_argument("--input", required=True, help="directory with the data set's train/test files")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    files = find_split_files(args.input)
    train = to_rows(read_split(files["train"], required), "train")[: args.train_size]
    test = to_rows(read_split(files["test"], required), "test")[: args.test_size]
    write_splits(args.out, train, test)
