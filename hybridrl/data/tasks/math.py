"""MATH preprocessor: the competition-math files to verl's schema (`DigitalLearningGmbH/MATH-lighteval`).

    python -m hybridrl.data.tasks.math --input ~/raw/MATH --out ~/data/math

Reads Hendrycks' release (`train/<subject>/<n>.json`), the hub's parquet or jsonl; solutions without a
`\\boxed{...}` answer are skipped and counted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from hybridrl.data.tasks.sources import Record, make_row, preprocess_main

logger = logging.getLogger(__name__)

DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
REQUIRED = ("problem", "solution", "level", "type")
_COMMANDS = ("\\boxed", "\\fbox")


def _braced(text: str, start: int) -> str | None:
    """Content of the brace group opening at text[start] == '{'; escaped braces (\\{ \\}) don't count."""
    depth, i = 0, start
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2  # skip the escaped character, e.g. \{ in a set
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
        i += 1
    return None


def last_boxed(solution: str) -> str | None:
    """Content of the last-starting \\boxed{...} / \\fbox{...} (or '\\boxed 5'); None if there is none."""
    start = max(solution.rfind(cmd) for cmd in _COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _COMMANDS if solution.startswith(c, start))
    rest = start + len(cmd)
    if solution.startswith("{", rest):
        return _braced(solution, rest)
    if solution.startswith(" ", rest):  # '\boxed 5$': the argument runs to the closing '$'
        return solution[rest:].split("$")[0].strip() or None
    return None


def to_rows(records: Sequence[Record], split: str) -> list[dict]:
    rows, skipped = [], 0
    for rec in records:
        problem, solution = rec.fields["problem"], rec.fields["solution"]
        truth = last_boxed(solution)
        if truth is None:
            skipped += 1
            continue
        rows.append(make_row(data_source=DATA_SOURCE, question=problem, ground_truth=truth, answer=solution,
                             prompt_text=f"{problem} {INSTRUCTION}", split=split, index=len(rows),
                             extra={"level": rec.fields["level"], "type": rec.fields["type"]}))
    if skipped:
        logger.warning("%s: skipped %d of %d solutions with no \\boxed{} answer", split, skipped,
                       len(records))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    preprocess_main(__doc__.splitlines()[0], REQUIRED, to_rows, argv)


if __name__ == "__main__":
    main()
