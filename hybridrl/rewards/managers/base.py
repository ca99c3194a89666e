"""Shared machinery of the reward managers: decode rows, place scores, collect extras, print examples.

A reward manager turns a DataProto of generated responses into `token_level_scores`: a
(batch, response_len) float tensor that is zero except for each sequence's score on its last valid
response token (verl's convention; advantage estimators read it from there).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import torch

from hybridrl.protocol import DataProto
from hybridrl.rewards.score import default_compute_score


@dataclasses.dataclass
class DecodedRow:
    prompt_str: str
    response_str: str
    valid_response_length: int
    data_source: str
    ground_truth: Any
    extra_info: dict


def response_lengths(data: DataProto) -> torch.Tensor:
    """Valid response tokens per row, from the response part of `attention_mask` (verl's rule), or
    from `response_mask` when there is no attention mask. Shape (batch,)."""
    response_len = data.batch["responses"].shape[-1]
    if "attention_mask" in data.batch:
        return data.batch["attention_mask"][:, -response_len:].sum(dim=-1).long()
    if "response_mask" in data.batch:
        return data.batch["response_mask"].sum(dim=-1).long()
    raise KeyError("reward managers need batch['attention_mask'] or batch['response_mask'] to find valid tokens")


def decode_rows(data: DataProto, tokenizer: Any, reward_fn_key: str = "data_source") -> list[DecodedRow]:
    """Decode each row's valid prompt (left-padded) and response (right-padded) tokens."""
    for key in ("prompts", "responses"):
        if key not in data.batch:
            raise KeyError(f"reward managers need batch[{key!r}]; got keys {sorted(data.batch.keys())}")
    for key in (reward_fn_key, "reward_model"):
        if key not in data.non_tensor_batch:
            raise KeyError(f"reward managers need non_tensor_batch[{key!r}] (from the dataset's parquet columns)")
    prompts, responses = data.batch["prompts"], data.batch["responses"]  # (batch, P), (batch, R)
    prompt_len = prompts.shape[-1]
    if "attention_mask" in data.batch:
        prompt_valid = data.batch["attention_mask"][:, :prompt_len].sum(dim=-1).long()
    else:
        prompt_valid = torch.full((len(data),), prompt_len)
    resp_valid = response_lengths(data)
    extra_infos = data.non_tensor_batch.get("extra_info")
    rows = []
    for i in range(len(data)):
        p, r = int(prompt_valid[i]), int(resp_valid[i])
        reward_model = data.non_tensor_batch["reward_model"][i]
        extra = extra_infos[i] if extra_infos is not None and extra_infos[i] is not None else {}
        if not isinstance(reward_model, Mapping) or "ground_truth" not in reward_model:
            # batch rows are shuffled and repeated; extra_info.index is the dataset's own id of the row
            raise KeyError(f"batch row {i} (extra_info.index={extra.get('index')!r}): "
                           f"non_tensor_batch['reward_model'] must be a dict with 'ground_truth'")
        rows.append(DecodedRow(
            prompt_str=tokenizer.decode(prompts[i, prompt_len - p:].tolist(), skip_special_tokens=True),
            response_str=tokenizer.decode(responses[i, :r].tolist(), skip_special_tokens=True),
            valid_response_length=r,
            data_source=str(data.non_tensor_batch[reward_fn_key][i]),
            ground_truth=reward_model["ground_truth"],
            extra_info=dict(extra),
        ))
    return rows


def split_result(result: Any) -> tuple[float, dict]:
    """A scorer's return value -> (score, extras). Dicts must carry `score`; extras include it."""
    if isinstance(result, Mapping):
        if "score" not in result:
            raise KeyError(f"a reward function returned a dict without 'score': {sorted(result)}")
        return float(result["score"]), dict(result)
    return float(result), {}


class RewardManager:
    """Base class: subclasses implement `score_rows(rows) -> list of (score, extras)`."""

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int = 0,
        compute_score: Callable[..., Any] | None = None,
        reward_fn_key: str = "data_source",
    ) -> None:
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key

    @classmethod
    def config_kwargs(cls, config: Mapping[str, Any]) -> dict:
        """Constructor arguments this manager reads from the full config (none by default)."""
        return {}

    def score_rows(self, rows: list[DecodedRow]) -> list[tuple[float, dict]]:
        raise NotImplementedError

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict:
        """Scores on the last valid response token; with `return_dict`, also per-sample extras."""
        if "rm_scores" in data.batch:
            # Scores already computed by the reward model worker are used as they are (as in verl).
            return {"reward_tensor": data.batch["rm_scores"], "reward_extra_info": {}} if return_dict \
                else data.batch["rm_scores"]
        rows = decode_rows(data, self.tokenizer, self.reward_fn_key)
        results = self.score_rows(rows)
        reward_tensor = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)  # (batch, R)
        for i, (row, (score, _)) in enumerate(zip(rows, results, strict=True)):
            if row.valid_response_length > 0:  # an empty response has no token to carry a score
                reward_tensor[i, row.valid_response_length - 1] = score
        extra_info = collect_extras([extras for _, extras in results])
        self.print_examples(rows, [score for score, _ in results])
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": extra_info}
        return reward_tensor

    def print_examples(self, rows: list[DecodedRow], scores: list[float]) -> None:
        """Print up to `num_examine` decoded examples per data source (what verl users look at)."""
        printed: dict[str, int] = defaultdict(int)
        for row, score in zip(rows, scores, strict=True):
            if printed[row.data_source] >= self.num_examine:
                continue
            printed[row.data_source] += 1
            print(f"[data_source] {row.data_source}\n[prompt] {row.prompt_str}\n[response] {row.response_str}\n"
                  f"[ground_truth] {row.ground_truth}\n[score] {score}")


def collect_extras(per_row: list[dict]) -> dict[str, list]:
    """Row dicts -> column lists of equal length (None where a row lacks a key)."""
    keys = sorted({key for extras in per_row for key in extras})
    return {key: [extras.get(key) for extras in per_row] for key in keys}
