"""Reward managers, by name (`reward_model.reward_manager`: naive, batch, prime, dapo): responses in, a
(batch, response_len) score tensor out, zero but for each score on its row's last valid response token
(verl's convention). Built from the config by `hybridrl.trainer.dataflow.load_reward_manager`; a user's
reward function (verl's `custom_reward_function`, returning a float or a dict with a `score` key whose other
keys become per-sample metrics) is loaded by `get_custom_reward_fn`.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from hybridrl.protocol import DataProto
from hybridrl.rewards.failures import (
    DEFAULT_MAX_FAILURE_SHARE,
    DEFAULT_TIMEOUT_S,
    FAILED_SCORE,
    FailureReport,
    Outcome,
    Status,
    check_batch_scores,
    check_score,
    log_failures,
    raise_if_fatal,
    raise_if_over_limit,
    zero_like,
)
from hybridrl.rewards.pool import make_runner
from hybridrl.rewards.scorers import default_compute_score
from hybridrl.utils.registry import (
    DEFAULT_REWARD_FUNCTION,
    FileRewardFunction,
    Registry,
    load_custom_reward_function,
)
from hybridrl.utils.typed_config import FreezableConfig, to_dataclass


@dataclass
class CustomRewardFunctionConfig(FreezableConfig):
    """`custom_reward_function.*`: the one home of these keys' defaults."""

    # A .py file defining compute_score(data_source, solution_str, ground_truth, extra_info=None).
    path: str | None = None
    name: str = DEFAULT_REWARD_FUNCTION
    # Keyword arguments bound to every call of the function.
    reward_kwargs: dict[str, Any] = field(default_factory=dict)


def get_custom_reward_fn(config: Mapping[str, Any]) -> Callable[..., Any] | None:
    """The function named by `config["custom_reward_function"]`, or None when no path is set."""
    section = to_dataclass(CustomRewardFunctionConfig, config.get("custom_reward_function") or {})
    if not section.path:
        return None
    return load_custom_reward_function(section.path, section.name, section.reward_kwargs)


REWARD_MANAGERS: Registry = Registry("reward manager")


@dataclass
class OverlongBufferConfig(FreezableConfig):
    """`reward_model.overlong_buffer.*`: DAPO's soft overlong punishment (the one home of its defaults)."""

    enable: bool = False
    # The last `len` tokens before data.max_response_length, over which the penalty grows to -penalty_factor.
    len: int = 0
    penalty_factor: float = 0.0
    # Report the penalty per sample in the reward extras (overlong_reward, overlong).
    log: bool = False


# extra_info key -> the rollout column it is taken from
ROLLOUT_EXTRA_INFO = {"num_turns": "__num_turns__", "rollout_reward_scores": "reward_scores",
                      "tool_rewards": "tool_rewards", "turn_scores": "turn_scores"}


@dataclass
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
    # what a multi-turn rollout's tools reported, under verl's extra_info keys
    from_rollout = {name: data.non_tensor_batch[column] for name, column in ROLLOUT_EXTRA_INFO.items()
                    if column in data.non_tensor_batch}
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
            extra_info={**extra, **{name: values[i] for name, values in from_rollout.items()}},
        ))
    return rows


def max_failures(share: float, rows: int) -> int:
    """The most failed rows of `rows` whose share is still <= `share` (exact, unlike floor(share * rows))."""
    k = min(rows, int(share * rows) + 1)
    while k > 0 and k / rows > share:
        k -= 1
    return k


def function_name(fn: Callable[..., Any]) -> str:
    """How error messages name the reward function: its file for a custom one, else its import path."""
    while isinstance(fn, functools.partial):  # e.g. default_compute_score with settings bound
        fn = fn.func
    if isinstance(fn, FileRewardFunction):
        return f"{fn.name} in {fn.path} (custom_reward_function.path/name)"
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class RewardManager:
    """Base class: decode rows, score them through a guarded runner (hybridrl/rewards/pool.py), place the
    scores; failures are handled as hybridrl/rewards/failures.py says. Subclasses change how rows become
    calls (`score_rows`) or shape each row's result (`finish`).
    """

    # runs in the worker on each call's return value
    check: Callable[[Any, Mapping[str, Any]], Any] = staticmethod(check_score)

    def __init__(self, tokenizer: Any, num_examine: int = 0, compute_score: Callable[..., Any] | None = None,
                 reward_fn_key: str = "data_source", timeout: float = DEFAULT_TIMEOUT_S,
                 num_workers: int | None = None,
                 max_failure_share: float = DEFAULT_MAX_FAILURE_SHARE) -> None:
        if not 0.0 <= max_failure_share <= 1.0:
            raise ValueError(f"reward_model.max_failure_share must be in [0, 1] (1.0 never stops the run), "
                             f"got {max_failure_share}")
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.examined_prompts: set[tuple[str, str]] = set()  # (data_source, prompt) shown by print_examples
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key
        self.max_failure_share = max_failure_share
        self.runner = make_runner(self.compute_score, type(self).check, timeout, num_workers)

    @classmethod
    def config_kwargs(cls, reward_model: Any, max_response_length: int) -> dict:
        """Constructor arguments from the typed `reward_model.*` config; subclasses add their own."""
        return {"timeout": reward_model.reward_fn_timeout, "num_workers": reward_model.reward_fn_workers,
                "max_failure_share": reward_model.max_failure_share}

    def close(self) -> None:
        """Stop the worker processes (garbage collection also does)."""
        self.runner.close()

    def score_rows(self, rows: list[DecodedRow]) -> list[Outcome]:
        """One Outcome per row, valued (score, extras) when ok; one call per row."""
        calls = [{"data_source": row.data_source, "solution_str": row.response_str,
                  "ground_truth": row.ground_truth, "extra_info": row.extra_info} for row in rows]
        return self.runner.map(calls, max_failures(self.max_failure_share, len(rows)))

    def finish(self, row: DecodedRow, outcome: Outcome, score: float, extras: dict) -> tuple[float, dict]:
        """A row's final (score, extras), given its call's outcome (failed rows arrive as FAILED_SCORE)."""
        return score, extras

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict:
        """Scores on the last valid response token; `return_dict` adds the extras and `reward_metrics`."""
        if "rm_scores" in data.batch:
            # the reward model worker's scores, as in verl
            return {"reward_tensor": data.batch["rm_scores"], "reward_extra_info": {}, "reward_metrics": {}} \
                if return_dict else data.batch["rm_scores"]
        rows = decode_rows(data, self.tokenizer, self.reward_fn_key)
        outcomes = self.score_rows(rows)
        report = FailureReport.from_outcomes(outcomes)
        sources = [row.data_source for row in rows]
        raise_if_fatal(report, sources)
        log_failures(report, sources, type(self).__name__)
        fix_hint = f"Fix the reward function, {function_name(self.compute_score)}. "
        raise_if_over_limit(report, self.max_failure_share, sources, fix_hint)
        results = self._results(rows, outcomes)
        reward_tensor = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)  # (batch, R)
        for i, (row, (score, _)) in enumerate(zip(rows, results, strict=True)):
            if row.valid_response_length > 0:  # an empty response has no token to carry a score
                reward_tensor[i, row.valid_response_length - 1] = score
        # one column per key any row returned (None where a row lacks it)
        keys = sorted({key for _, extras in results for key in extras})
        extra_info = {key: [extras.get(key) for _, extras in results] for key in keys}
        self.print_examples(rows, [score for score, _ in results])
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": extra_info,
                    "reward_metrics": report.metrics()}
        return reward_tensor

    def _results(self, rows: list[DecodedRow], outcomes: list[Outcome]) -> list[tuple[float, dict]]:
        """(score, extras) per row; a failed row gets FAILED_SCORE and zeros for the others' extras."""
        template: dict[str, Any] = {}
        for outcome in outcomes:
            if outcome.status is Status.OK:
                for key, value in outcome.value[1].items():
                    template.setdefault(key, zero_like(value))
        results = []
        for row, outcome in zip(rows, outcomes, strict=True):
            if outcome.status is Status.OK:
                score, extras = outcome.value
            else:
                score, extras = FAILED_SCORE, {**template, **({"score": FAILED_SCORE} if "score" in template else {})}
            results.append(self.finish(row, outcome, score, extras))
        return results

    def print_examples(self, rows: list[DecodedRow], scores: list[float]) -> None:
        """Print up to `num_examine` decoded examples per data source, each of a prompt not shown before."""
        printed: dict[str, int] = defaultdict(int)
        for row, score in zip(rows, scores, strict=True):
            key = (row.data_source, row.prompt_str)
            if printed[row.data_source] >= self.num_examine or key in self.examined_prompts:
                continue
            printed[row.data_source] += 1
            self.examined_prompts.add(key)
            print(f"[data_source] {row.data_source}\n[prompt] {row.prompt_str}\n[response] {row.response_str}\n"
                  f"[ground_truth] {row.ground_truth}\n[score] {score}")


@REWARD_MANAGERS.register("naive")
class NaiveRewardManager(RewardManager):
    """`naive`: score each response on its own, one guarded call per response (verl's default manager)."""


@REWARD_MANAGERS.register("batch")
class BatchRewardManager(RewardManager):
    """`batch` (verl's BatchRewardManager): one guarded call `compute_score(data_sources=[...],
    solution_strs=[...], ground_truths=[...], extra_infos=[...], **reward_kwargs)` returning one float or
    dict per response. A failed call fails every row; a bad item only its own.
    """

    check = staticmethod(check_batch_scores)

    def __init__(self, tokenizer: Any, num_examine: int = 0, compute_score: Callable[..., Any] | None = None,
                 reward_fn_key: str = "data_source", timeout: float = DEFAULT_TIMEOUT_S,
                 num_workers: int | None = None, max_failure_share: float = DEFAULT_MAX_FAILURE_SHARE,
                 **reward_kwargs: Any) -> None:
        if compute_score is None:
            raise ValueError("the batch reward manager needs a batched compute_score; set custom_reward_function.path")
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, timeout, num_workers,
                         max_failure_share)
        self.reward_kwargs = reward_kwargs

    def score_rows(self, rows: list[DecodedRow]) -> list[Outcome]:
        call = {"data_sources": [r.data_source for r in rows],
                "solution_strs": [r.response_str for r in rows],
                "ground_truths": [r.ground_truth for r in rows],
                "extra_infos": [r.extra_info for r in rows], **self.reward_kwargs}
        (outcome,) = self.runner.map([call])
        if outcome.status is Status.OK:
            return outcome.value
        return [outcome] * len(rows)  # the call failed: so did every row


@REWARD_MANAGERS.register("prime")
class PrimeRewardManager(RewardManager):
    """`prime` (verl's PrimeRewardManager): its `timeout` / `num_processes` (from reward_model.reward_kwargs)
    override reward_fn_timeout / reward_fn_workers; adds per-sample extras `reward_timeout`, `reward_error`.
    """

    def __init__(self, *args: Any, num_processes: int | None = None, **kwargs: Any) -> None:
        if num_processes is not None:
            kwargs["num_workers"] = num_processes
        super().__init__(*args, **kwargs)

    def finish(self, row: DecodedRow, outcome: Outcome, score: float, extras: dict) -> tuple[float, dict]:
        timed_out = outcome.status is Status.TIMEOUT
        return score, {**extras, "reward_timeout": timed_out, "reward_error": outcome.status is not Status.OK
                       and not timed_out}


@REWARD_MANAGERS.register("dapo")
class DAPORewardManager(RewardManager):
    """`dapo`: the score plus DAPO's Soft Overlong Punishment (https://arxiv.org/abs/2503.14476).

    penalty = min(-(n - (L - B)) / B * f, 0) for n valid tokens, L = max_resp_len, B = overlong_buffer.len,
    f = overlong_buffer.penalty_factor; it depends on the length only, so failed rows get it too.
    """

    def __init__(self, *args: Any, max_resp_len: int | None = None,
                 overlong_buffer_cfg: OverlongBufferConfig | Mapping[str, Any] | None = None,
                 **kwargs: Any) -> None:
        self.overlong_buffer = to_dataclass(OverlongBufferConfig, overlong_buffer_cfg)
        if self.overlong_buffer.enable:
            if max_resp_len is None:
                raise ValueError("reward_model.overlong_buffer.enable=True needs max_resp_len "
                                 "(data.max_response_length)")
            if not 0 < self.overlong_buffer.len <= max_resp_len:
                raise ValueError(f"reward_model.overlong_buffer.len={self.overlong_buffer.len} must be in "
                                 f"(0, max_resp_len={max_resp_len}]")
        self.max_resp_len = max_resp_len
        super().__init__(*args, **kwargs)

    @classmethod
    def config_kwargs(cls, reward_model: Any, max_response_length: int) -> dict:
        return {**super().config_kwargs(reward_model, max_response_length),
                "max_resp_len": max_response_length, "overlong_buffer_cfg": reward_model.overlong_buffer}

    def overlong_penalty(self, valid_len: int) -> float:
        buffer_len = self.overlong_buffer.len
        exceed = valid_len - (self.max_resp_len - buffer_len)
        return min(-exceed / buffer_len * self.overlong_buffer.penalty_factor, 0.0)

    def finish(self, row: DecodedRow, outcome: Outcome, score: float, extras: dict) -> tuple[float, dict]:
        extras = {**extras, "score": extras.get("score", score)}  # the unshaped score, for metrics
        if self.overlong_buffer.enable:
            penalty = self.overlong_penalty(row.valid_response_length)
            score += penalty
            if self.overlong_buffer.log:
                extras.update(overlong_reward=penalty, overlong=penalty < 0)
        return score, extras
