"""Validation, and the generations a run writes to `trainer.rollout_data_dir` / `validation_data_dir` as
`<step>.jsonl` in verl's layout (a rerun of a step overwrites its file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from hybridrl.protocol import DataProto
from hybridrl.rewards.failures import add_reward_metrics
from hybridrl.rewards.managers import decode_rows
from hybridrl.trainer import dataflow
from hybridrl.trainer.metrics import process_validation_metrics, validation_metrics_to_flat
from hybridrl.trainer.ppo_config import PPOTrainerConfig
from hybridrl.trainer.worker_groups import WorkerGroups
from hybridrl.workers.rollout.agent_loop import AGENT_INPUT_COLUMNS, NUMERIC_COLUMNS


class Validator:
    """Validation: sample the held-out prompts with `rollout.val_kwargs`, score them, report per data source."""

    def __init__(self, config: PPOTrainerConfig, tokenizer: Any, groups: WorkerGroups, reward_fn: Any,
                 dataset: Any, collate_fn: Any) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.groups = groups
        self.reward_fn = reward_fn
        self.rollout_columns = AGENT_INPUT_COLUMNS if config.actor_rollout_ref.rollout.multi_turn.enable else ()
        batch_size = config.data.val_batch_size or len(dataset)
        # shuffled, the order (which generations log_val_generations prints) is drawn anew each validation
        shuffle = config.data.validation_shuffle
        generator = torch.Generator().manual_seed(config.data.seed) if shuffle else None
        self.dataloader = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator,
                                     collate_fn=collate_fn)

    def run(self, step: int) -> dict[str, float]:
        """Generate for every validation prompt (val_kwargs.n samples each), score, and summarise."""
        sources, uids, texts, infos = [], [], [], {"reward": []}
        failures: dict[str, float] = {}
        for batch_dict in self.dataloader:
            batch = dataflow.new_prompt_batch(batch_dict)
            gen_input = dataflow.split_generation_input(batch, self.rollout_columns)
            gen_input.meta_info = {"validate": True}
            batch = dataflow.attach_responses(batch, self.groups.rollout.generate_sequences(gen_input))
            result = self.reward_fn(batch, return_dict=True)
            scores = result["reward_tensor"].sum(dim=-1).tolist()
            add_reward_metrics(failures, result.get("reward_metrics", {}))
            infos["reward"] += scores
            for key, values in result.get("reward_extra_info", {}).items():
                infos.setdefault(key, []).extend(values)
            for key in NUMERIC_COLUMNS:  # the agent loop's per-sample counts (tool calls, turns, ...)
                if key in batch.non_tensor_batch:
                    infos.setdefault(key, []).extend(float(v) for v in batch.non_tensor_batch[key])
            sources += list(batch.non_tensor_batch.get(self.config.data.reward_fn_key, ["unknown"] * len(batch)))
            uids += list(batch.non_tensor_batch["uid"])
            texts += generation_records(batch, self.tokenizer, scores, result.get("reward_extra_info"),
                                        self.config.data.reward_fn_key)
        write_generations(self.config.trainer.validation_data_dir, step, texts)
        for row in texts[: self.config.trainer.log_val_generations]:
            print(f"[validation] {row['input']!r} -> {row['output']!r} (score {row['score']})")
        grouped = process_validation_metrics(sources, uids, infos)
        return {**validation_metrics_to_flat(grouped), **{f"val-aux/{key}": value for key, value in failures.items()}}


_RESERVED = {"input", "output", "gts", "score", "step"}


def generation_records(batch: DataProto, tokenizer: Any, scores: list[float],
                       extra: dict[str, list] | None = None, reward_fn_key: str = "data_source") -> list[dict]:
    """One dict per row of `batch` (which holds `prompts`, `responses` and the parquet's reward_model)."""
    rows = decode_rows(batch, tokenizer, reward_fn_key)
    extra = {key: values for key, values in (extra or {}).items() if key not in _RESERVED}
    return [{"input": row.prompt_str, "output": row.response_str, "gts": _plain(row.ground_truth),
             "score": float(scores[i]), **{key: _plain(values[i]) for key, values in extra.items()}}
            for i, row in enumerate(rows)]


def write_generations(out_dir: str | None, step: int, records: list[dict]) -> None:
    """Write `records` to `out_dir/<step>.jsonl`; does nothing when `out_dir` is unset."""
    if not out_dir:
        return
    path = Path(out_dir) / f"{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps({**record, "step": step}) + "\n")


def _plain(value: Any) -> Any:
    """numpy scalars and arrays -> Python values json can write."""
    return value.tolist() if hasattr(value, "tolist") else value
