"""main_eval: mean@n / pass@n per data source against hand-computed values, built-in and custom scorers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_dir

import hybridrl.trainer.main_eval as main_eval

CONFIG_DIR = str(Path(main_eval.__file__).parent / "config")


def compose_eval(overrides: list[str]):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose("evaluation", overrides=overrides)


@pytest.fixture()
def scored_parquet(tmp_path) -> Path:
    def row(source: str, truth: str, responses: list[str]) -> dict:
        return {"data_source": source, "reward_model": {"style": "rule", "ground_truth": truth},
                "extra_info": {"index": 0}, "responses": responses}

    right, wrong = "3+4+0=7 c0\n<answer>7</answer>", "<answer>8</answer>"
    rows = [
        row("arithmetic", "7", [right, wrong, wrong, "no tag"]),  # scores 1, 0, 0, 0
        row("arithmetic", "7", [wrong, wrong, wrong, wrong]),  # scores 0, 0, 0, 0
        row("arithmetic", "12", ["<answer>12</answer>"] * 4),  # scores 1, 1, 1, 1
    ]
    path = tmp_path / "gen.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_mean_and_pass_at_n(scored_parquet):
    metrics = main_eval.evaluate(compose_eval([f"data.path={scored_parquet}"]))
    # mean@4 = (1/4 + 0 + 1) / 3 = 0.41667; pass@4 = rows with a 1: 2 of 3
    assert metrics["arithmetic/mean@4"] == pytest.approx(1.25 / 3)
    assert metrics["arithmetic/pass@4"] == pytest.approx(2 / 3)
    assert metrics["all/pass@4"] == pytest.approx(2 / 3)


def test_custom_reward_function_and_dict_scores(scored_parquet, tmp_path):
    custom = tmp_path / "reward.py"
    custom.write_text(
        "def length_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': len(solution_str) / 100, 'length': len(solution_str)}\n"
    )
    metrics = main_eval.evaluate(compose_eval([
        f"data.path={scored_parquet}", f"custom_reward_function.path={custom}",
        "custom_reward_function.name=length_score", "pass_threshold=0.2",
    ]))
    # lengths: row 0: 29 (10 + newline + 18), 18, 18, 6 -> mean .1775, max .29 passes;
    # row 1: 18 x4 -> .18, fails; row 2: 19 x4 -> .19, fails.
    # mean@4 = (.1775 + .18 + .19) / 3 = .1825; pass@4 = 1/3
    assert metrics["arithmetic/mean@4"] == pytest.approx(0.1825)
    assert metrics["arithmetic/pass@4"] == pytest.approx(1 / 3)


def test_missing_column_names_the_key(scored_parquet):
    with pytest.raises(KeyError, match="data.response_key"):
        main_eval.evaluate(compose_eval([f"data.path={scored_parquet}", "data.response_key=answers"]))


def test_cli_prints_metrics(scored_parquet):
    out = subprocess.run([sys.executable, "-m", "hybridrl.trainer.main_eval", f"data.path={scored_parquet}"],
                         check=True, capture_output=True, text=True).stdout
    assert "arithmetic/pass@4: 0.6667" in out and "arithmetic/mean@4: 0.4167" in out
