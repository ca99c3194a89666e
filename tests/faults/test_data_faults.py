"""Bad data rows end a Ray run with 2 workers before Ray starts, naming file, row and column.

Issue 19's probes: an overlong prompt at row 180 under `truncation=error` used to end the run at step
23 (32 s in, 22 steps lost); an empty prompt list or a null ground truth failed after Ray started
without naming file and row; a wrong-typed `reward_model` cell was reported as "row 0" of the batch.
All probes run in one fresh interpreter (`preflight_probe`), which also tells whether Ray was imported.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from ppo_helpers import tiny_run_overrides
from preflight_probe import ProbeResult, run_probes

from hybridrl.protocol import DataProto
from hybridrl.rewards.managers import decode_rows

ROWS = 200  # room for the overlong prompt at row 180
# the setting: Ray with 2 workers (tests/faults/conftest.py's fault_run_overrides runs locally)
RAY_RUN = ["trainer.backend=ray", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=2"]
LONG = "Compute the sum of all of these numbers one by one, column by column: " + "12 + 34 + " * 20


def base_rows(fault_data: Path) -> list[dict]:
    rows = pq.read_table(fault_data / "train.parquet").to_pylist()
    return [dict(rows[i % len(rows)]) for i in range(ROWS)]


def set_cell(rows: list[dict], index: int, column: str, value) -> list[dict]:
    rows[index] = {**rows[index], column: value}
    return rows


def data_dir(root: Path, fault_data: Path, train: pa.Table, name: str) -> Path:
    """root/name with train.parquet = `train` and the task's test.parquet."""
    out = root / name
    out.mkdir()
    pq.write_table(train, out / "train.parquet")
    shutil.copy(fault_data / "test.parquet", out / "test.parquet")
    return out


@pytest.fixture(scope="module")
def probes(fault_data: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, ProbeResult]:
    root = tmp_path_factory.mktemp("bad_data")
    rows = lambda: base_rows(fault_data)  # noqa: E731 - a fresh copy per probe
    overlong = set_cell(rows(), 180, "prompt", [{"role": "user", "content": LONG}])
    no_truth = set_cell(rows(), 57, "reward_model", {"style": "rule", "ground_truth": None})
    empty_prompt = set_cell(rows(), 123, "prompt", [])
    table = pa.Table.from_pylist(rows())
    as_text = pa.array([json.dumps(cell) for cell in table.column("reward_model").to_pylist()])
    text_reward = table.set_column(table.column_names.index("reward_model"), "reward_model", as_text)
    bad_val = data_dir(root, fault_data, pa.Table.from_pylist(rows()), "bad_val")
    pq.write_table(pa.Table.from_pylist(set_cell(pq.read_table(fault_data / "test.parquet").to_pylist(), 5,
                                                 "prompt", [])), bad_val / "test.parquet")
    dirs = {
        "overlong": data_dir(root, fault_data, pa.Table.from_pylist(overlong), "overlong"),
        "no_truth": data_dir(root, fault_data, pa.Table.from_pylist(no_truth), "no_truth"),
        "empty_prompt": data_dir(root, fault_data, pa.Table.from_pylist(empty_prompt), "empty_prompt"),
        "text_reward": data_dir(root, fault_data, text_reward, "text_reward"),
        "bad_val": bad_val,
    }
    return run_probes({name: [*tiny_run_overrides(path, tiny_model_dir, root / f"run_{name}"), *RAY_RUN]
                       for name, path in dirs.items()})


@pytest.mark.parametrize("probe, file, row, column, problem", [
    ("overlong", "overlong/train.parquet", 180, "prompt", r"the prompt has \d+ tokens, more than "
                                                          r"data.max_prompt_length=40"),
    ("empty_prompt", "empty_prompt/train.parquet", 123, "prompt", "the prompt is an empty list of chat messages"),
    ("no_truth", "no_truth/train.parquet", 57, "reward_model", "reward_model.ground_truth is missing or null"),
    ("text_reward", "text_reward/train.parquet", 0, "reward_model",
     "must be a dict with a 'ground_truth' entry, got str"),
    ("bad_val", "bad_val/test.parquet", 5, "prompt", "the prompt is an empty list of chat messages"),
])
def test_a_bad_row_fails_before_ray_starts_naming_file_row_and_column(probes, probe, file, row, column, problem):
    result = probes[probe]
    print("\nPROBE", probe, round(result.seconds, 2), result.message)
    assert result.backend == "ray"
    assert result.error == "DataError", result.message
    assert re.search(rf"{re.escape(file)} row {row}, column '{column}': {problem}", result.message), result.message
    assert "Fix: " in result.message
    assert not result.ray_imported  # the run stopped before it started (or even imported) Ray
    assert result.seconds < 60, result.seconds


def test_every_row_of_a_wrong_typed_column_is_counted(probes):
    # the whole column is text, so the error lists the first rows and counts the rest
    assert f"{ROWS} of {ROWS} data rows cannot be used" in probes["text_reward"].message
    assert f"... and {ROWS - 5} more" in probes["text_reward"].message


def test_a_bad_reward_cell_reaching_a_reward_manager_names_the_dataset_row(tiny_tokenizer):
    # Rows built without RLHFDataset's load-time checks can still reach a reward manager; the error then
    # names the row's extra_info.index (the dataset's id of it), not just its place in a shuffled batch.
    ids = torch.ones((2, 3), dtype=torch.long)  # (batch, len) for prompts and responses alike
    data = DataProto.from_dict(
        {"prompts": ids, "responses": ids, "attention_mask": torch.ones((2, 6), dtype=torch.long)},
        {"data_source": np.array(["arithmetic"] * 2, dtype=object),
         "reward_model": np.array([{"ground_truth": "3"}, "3"], dtype=object),
         "extra_info": np.array([{"index": 41}, {"index": 180}], dtype=object)},
    )
    with pytest.raises(KeyError, match=r"batch row 1 \(extra_info.index=180\): non_tensor_batch\['reward_model'\]"):
        decode_rows(data, tiny_tokenizer)
