"""Validation: sample the held-out prompts with `rollout.val_kwargs`, score them, report per data source."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from hybridrl.protocol import DataProto
from hybridrl.trainer import dataflow
from hybridrl.trainer.metrics import process_validation_metrics, validation_metrics_to_flat
from hybridrl.trainer.ppo_config import PPOTrainerConfig


class Validator:
    def __init__(self, config: PPOTrainerConfig, tokenizer: Any, groups: Any, reward_fn: Any,
                 dataset: Any, collate_fn: Any) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.groups = groups
        self.reward_fn = reward_fn
        batch_size = config.data.val_batch_size or len(dataset)
        self.dataloader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate_fn)

    def run(self, step: int) -> dict[str, float]:
        """Generate for every validation prompt (val_kwargs.n samples each), score, and summarise."""
        sources, uids, texts, infos = [], [], [], {"reward": []}
        for batch_dict in self.dataloader:
            batch = dataflow.new_prompt_batch(batch_dict)
            gen_input = dataflow.split_generation_input(batch)
            gen_input.meta_info = {"validate": True}
            batch = dataflow.attach_responses(batch, self.groups.actor_rollout.generate_sequences(gen_input))
            result = self.reward_fn(batch, return_dict=True)
            scores = result["reward_tensor"].sum(dim=-1).tolist()
            infos["reward"] += scores
            for key, values in result.get("reward_extra_info", {}).items():
                infos.setdefault(key, []).extend(values)
            sources += list(batch.non_tensor_batch.get(self.config.data.reward_fn_key, ["unknown"] * len(batch)))
            uids += list(batch.non_tensor_batch["uid"])
            texts += self._decode(batch, scores)
        self._dump(step, texts)
        self._print_examples(texts)
        grouped = process_validation_metrics(sources, uids, infos)
        return validation_metrics_to_flat(grouped)

    def _decode(self, batch: DataProto, scores: list[float]) -> list[dict]:
        prompts = self.tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True)
        responses = self.tokenizer.batch_decode(batch.batch["responses"], skip_special_tokens=True)
        return [{"input": p, "output": r, "score": s} for p, r, s in zip(prompts, responses, scores, strict=True)]

    def _dump(self, step: int, texts: list[dict]) -> None:
        out_dir = self.config.trainer.validation_data_dir
        if not out_dir:
            return
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(out_dir) / f"{step}.jsonl", "w") as f:
            for row in texts:
                f.write(json.dumps({**row, "step": step}) + "\n")

    def _print_examples(self, texts: list[dict]) -> None:
        for row in texts[: self.config.trainer.log_val_generations]:
            print(f"[validation] {row['input']!r} -> {row['output']!r} (score {row['score']})")
