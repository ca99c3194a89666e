"""GSM8K preprocessor: the publisher's files to verl's schema (data_source `openai/gsm8k`).

    python -m hybridrl.data.tasks.gsm8k --input ~/raw/gsm8k --out ~/data/gsm8k

Reads `train.jsonl`/`test.jsonl` (github.com/openai/grade-school-math) or the hub's parquet.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hybridrl.data.tasks.sources import Record, make_row, preprocess_main

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'

_FINAL = re.compile(r"####\s*(-?[0-9.,]+)")


def extract_answer(solution: str) -> str | None:
    """The number after the last '####', commas dropped ('#### 1,234' -> '1234'); None if absent."""
    matches = _FINAL.findall(solution)
    return (matches[-1].replace(",", "").rstrip(".") or None) if matches else None


def to_rows(records: Sequence[Record], split: str) -> list[dict]:
    rows = []
    for i, rec in enumerate(records):
        question, solution = rec.fields["question"], rec.fields["answer"]
        truth = extract_answer(solution)
        if truth is None:
            raise ValueError(f"{rec.source}: answer has no final '#### <number>' line: {solution[-80:]!r}")
        rows.append(make_row(data_source=DATA_SOURCE, question=question, ground_truth=truth, answer=solution,
                             prompt_text=f"{question} {INSTRUCTION}", split=split, index=i))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    preprocess_main(__doc__.splitlines()[0], ["question", "answer"], to_rows, argv)


if __name__ == "__main__":
    main()
