"""Offline evaluation: `python -m hybridrl.trainer.main_eval key=value ...` (config `evaluation.yaml`).

Scores every response of main_generation's parquet, per data source and over all rows of n scores s_1..s_n:

    mean@n = mean over rows of (1/n) sum_i s_i                    (expected score of one sample)
    pass@n = fraction of rows with max_i s_i >= pass_threshold    (Chen et al. 2021's pass@k, k = n)
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pyarrow.parquet as pq
from omegaconf import DictConfig, OmegaConf

from hybridrl.rewards import default_compute_score
from hybridrl.rewards.managers import get_custom_reward_fn
from hybridrl.trainer.command_line import verl_overrides, yaml_keys


def _as_float(result: float | Mapping[str, Any], where: str) -> float:
    if isinstance(result, Mapping):
        if "score" not in result:
            raise KeyError(f"{where}: the reward function returned a dict without a 'score' key: {result}")
        result = result["score"]
    return float(result)


def _column(table, key: str, config_key: str) -> list[Any]:
    if key not in table.column_names:
        raise KeyError(f"{config_key}={key!r} is not a column of the parquet; its columns are {table.column_names}")
    return table.column(key).to_pylist()


def evaluate(config: DictConfig, score_fn: Callable[..., Any] | None = None) -> dict[str, float]:
    """mean@n and pass@n per data source (`<source>/mean@n`, `<source>/pass@n`) and over all rows."""
    data = config.data
    table = pq.read_table(Path(data.path).expanduser())
    responses = _column(table, data.response_key, "data.response_key")
    sources = _column(table, data.data_source_key, "data.data_source_key")
    reward_models = _column(table, data.reward_model_key, "data.reward_model_key")
    extra = table.column("extra_info").to_pylist() if "extra_info" in table.column_names else [None] * len(sources)
    score_fn = score_fn or get_custom_reward_fn(OmegaConf.to_container(config)) or default_compute_score
    per_source: dict[str, list[list[float]]] = defaultdict(list)
    for row, (texts, source, reward_model, info) in enumerate(zip(responses, sources, reward_models, extra,
                                                                 strict=True)):
        if not texts:
            raise ValueError(f"row {row}: column {data.response_key!r} holds no responses")
        truth = reward_model["ground_truth"]
        where = f"row {row} ({source})"
        per_source[source].append([_as_float(score_fn(source, t, truth, info), where) for t in texts])
    metrics: dict[str, float] = {}
    groups = dict(per_source)
    groups["all"] = [scores for rows in per_source.values() for scores in rows]
    for source, rows in groups.items():
        n = max(len(scores) for scores in rows)
        metrics[f"{source}/mean@{n}"] = float(np.mean([np.mean(s) for s in rows]))
        metrics[f"{source}/pass@{n}"] = float(np.mean([max(s) >= config.pass_threshold for s in rows]))
    return metrics


@hydra.main(config_path="config", config_name="evaluation", version_base=None)
def hydra_main(config: DictConfig) -> dict[str, float]:
    metrics = evaluate(config)
    for name, value in metrics.items():
        print(f"{name}: {value:.4f}")
    return metrics


def main() -> None:
    """The command line as verl reads it (blank arguments dropped, `+key` on a declared key), then Hydra."""
    sys.argv[1:] = verl_overrides(sys.argv[1:], yaml_keys("evaluation"))
    hydra_main()


if __name__ == "__main__":
    main()
