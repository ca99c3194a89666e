"""`trainer.rollout_data_dir` / `trainer.validation_data_dir`: generations written as jsonl, one file per step.

Each line is one sample, in verl's layout: `input` (the prompt text), `output` (the response text, as
the reward function saw it), `gts` (the ground truth), `score`, `step`, plus every per-sample value
the reward function returned (e.g. `acc`). Files are named `<step>.jsonl`; a rerun of a step
overwrites its file, so a resumed run never appends duplicates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hybridrl.protocol import DataProto
from hybridrl.rewards.managers import decode_rows

_RESERVED = {"input", "output", "gts", "score", "step"}


def generation_records(batch: DataProto, tokenizer: Any, scores: list[float],
                       extra: dict[str, list] | None = None, reward_fn_key: str = "data_source") -> list[dict]:
    """One dict per row of `batch` (which holds `prompts`, `responses` and the parquet's reward_model)."""
    rows = decode_rows(batch, tokenizer, reward_fn_key)
    extra = {key: values for key, values in (extra or {}).items() if key not in _RESERVED}
    records = []
    for i, row in enumerate(rows):
        record = {"input": row.prompt_str, "output": row.response_str, "gts": _plain(row.ground_truth),
                  "score": float(scores[i])}
        record.update({key: _plain(values[i]) for key, values in extra.items()})
        records.append(record)
    return records


def write_generations(out_dir: str | None, step: int, records: list[dict]) -> Path | None:
    """Write `records` to `out_dir/<step>.jsonl`; does nothing when `out_dir` is unset."""
    if not out_dir:
        return None
    path = Path(out_dir) / f"{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps({**record, "step": step}) + "\n")
    return path


def _plain(value: Any) -> Any:
    """numpy scalars and arrays -> Python values json can write."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return value
