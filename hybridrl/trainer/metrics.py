"""The numbers the trainer logs each step, under verl's metric names and with verl's definitions: pure
functions of a DataProto (layout: docs/architecture.md, "The batch") or of plain lists returning
`{name: float}`. `StageCosts` gathers each stage's worker seconds and model FLOPs.

The divergence guard (`DivergenceGuard`): a training step whose loss or gradient norm is not finite is logged
as a warning and never checkpointed, and more than `max_consecutive_skipped_steps` of them in a row raise
`TrainingDivergedError`, naming the metrics, the key and the last checkpoint. The engine already skips a
non-finite gradient's optimizer step, but a run that only skips would go on with rc 0 and checkpoint a model
the update before the first NaN may have ruined. The default limit is 0: without an fp16 loss scaler a
non-finite gradient means divergence or NaN data, not a routine overflow.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hybridrl.protocol import DataProto
from hybridrl.utils.device import ProcessMemory, process_memory
from hybridrl.utils.metric import (
    ModelPass,
    mfu,
    pop_worker_seconds,
    reduce_metrics,  # re-exported: the trainer reduces worker metrics
    worker_stage,
)

logger = logging.getLogger(__name__)

__all__ = ["DivergenceGuard", "StageCosts", "TrainingDivergedError", "compute_data_metrics", "compute_memory_metrics", "compute_mfu_metrics",
           "compute_rollout_agreement_metrics", "compute_throughout_metrics", "compute_throughput_metrics",
           "compute_timing_metrics", "process_validation_metrics", "real_tokens", "reduce_metrics", "unhealthy_metrics",
           "validation_metrics_to_flat"]

# Timed passes that read whole sequences; `gen`'s per-token time divides by the response tokens it produces.
# Stages outside both get `timing_s/` only, as in verl.
_ALL_TOKEN_STAGES = ("ref", "values", "adv", "update_critic", "update_actor")


def _require(batch: DataProto, keys: Sequence[str], caller: str) -> None:
    missing = [k for k in keys if batch.batch is None or k not in batch.batch]
    if missing:
        have = sorted(batch.batch.keys()) if batch.batch is not None else []
        raise KeyError(f"{caller}: batch is missing tensor key(s) {missing}; it has {have}")


def _lengths(batch: DataProto) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Per-row prompt and response lengths (float, (B,)) from `attention_mask`, as verl, and the padded
    widths P and R."""
    _require(batch, ("responses", "attention_mask"), "metrics")
    max_response_len = batch.batch["responses"].shape[-1]
    attention_mask = batch.batch["attention_mask"]  # (B, P + R)
    max_prompt_len = attention_mask.shape[-1] - max_response_len
    prompt_length = attention_mask[:, :max_prompt_len].sum(-1).float()  # (B,)
    response_length = attention_mask[:, max_prompt_len:].sum(-1).float()  # (B,)
    return prompt_length, response_length, max_prompt_len, max_response_len


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    """`{prefix}/mean`, `/max`, `/min` of a 1-D tensor."""
    values = values.detach().float()
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(),
            f"{prefix}/min": values.min().item()}


def _length_stats(prefix: str, lengths: torch.Tensor, max_len: int) -> dict[str, float]:
    """Length stats plus `clip_ratio`: the share of rows that filled the whole padded width."""
    return {**_stats(prefix, lengths), f"{prefix}/clip_ratio": (lengths == max_len).float().mean().item()}


def compute_data_metrics(batch: DataProto, use_critic: bool = True) -> dict[str, float]:
    """Per-step statistics of the training batch (verl's `compute_data_metrics`).

    - `critic/score/*`, `critic/rewards/*`: sum_t token_level_scores[t] (the reward function's output)
      and sum_t token_level_rewards[t] (minus the KL penalty if any), over non-aborted rows;
    - `critic/advantages/*`, `critic/returns/*` (and `critic/values/*`): over the valid response tokens;
    - `critic/vf_explained_var` = 1 - Var[returns - values] / (Var[returns] + 1e-5), unbiased variances
      over valid tokens (1: the critic predicts returns perfectly, 0: no better than a constant);
    - `response_length/*`, `prompt_length/*` in tokens, `clip_ratio` the share filling the padded width;
    - `response/aborted_ratio`: share of empty responses, which `response_length_non_aborted/*` leaves out.
    """
    keys = ["token_level_scores", "token_level_rewards", "advantages", "returns", "response_mask"]
    _require(batch, keys + (["values"] if use_critic else []), "compute_data_metrics")
    prompt_length, response_length, max_prompt_len, max_response_len = _lengths(batch)
    response_mask = batch.batch["response_mask"].bool()  # (B, R)

    non_aborted = response_length > 0  # (B,)
    if not bool(non_aborted.any()):
        raise ValueError("compute_data_metrics: every response in the batch is empty (attention_mask has no "
                         "response tokens); the rollout produced nothing to train on")
    sequence_score = batch.batch["token_level_scores"].sum(-1)  # (B,)
    sequence_reward = batch.batch["token_level_rewards"].sum(-1)  # (B,)
    valid_returns = torch.masked_select(batch.batch["returns"], response_mask)  # (tokens,)

    metrics = {
        **_stats("critic/score", sequence_score[non_aborted]),
        **_stats("critic/rewards", sequence_reward[non_aborted]),
        **_stats("critic/advantages", torch.masked_select(batch.batch["advantages"], response_mask)),
        **_stats("critic/returns", valid_returns),
    }
    if use_critic:
        valid_values = torch.masked_select(batch.batch["values"], response_mask)  # (tokens,)
        metrics.update(_stats("critic/values", valid_values))
        explained = 1.0 - torch.var(valid_returns - valid_values) / (torch.var(valid_returns) + 1e-5)
        metrics["critic/vf_explained_var"] = explained.item()
    return {
        **metrics,
        **_length_stats("response_length", response_length, max_response_len),
        **_length_stats("response_length_non_aborted", response_length[non_aborted], max_response_len),
        "response/aborted_ratio": (~non_aborted).float().mean().item(),
        **_length_stats("prompt_length", prompt_length, max_prompt_len),
    }


def compute_timing_metrics(batch: DataProto, timing_raw: Mapping[str, float]) -> dict[str, float]:
    """`timing_s/<stage>` for every timed stage (the workers' own `<stage>_worker` included) and, for the
    model passes, timing_per_token_ms = 1000 * seconds / tokens: response tokens for `gen`, all (prompt +
    response) tokens for the others (verl's denominators)."""
    prompt_length, response_length, _, _ = _lengths(batch)
    response_tokens = response_length.sum().item()
    all_tokens = prompt_length.sum().item() + response_tokens
    denominators = {"gen": response_tokens, **dict.fromkeys(_ALL_TOKEN_STAGES, all_tokens)}
    # stages without a token count, and an (impossible in training) empty batch, get no per-token time
    return {**{f"timing_s/{stage}": float(seconds) for stage, seconds in timing_raw.items()},
            **{f"timing_per_token_ms/{stage}": float(seconds) * 1000.0 / denominators[stage]
               for stage, seconds in timing_raw.items() if denominators.get(stage)}}


def compute_throughput_metrics(
    batch: DataProto, timing_raw: Mapping[str, float], n_workers: int
) -> dict[str, float]:
    """`perf/total_num_tokens`, `perf/time_per_step` and `perf/throughput` in tokens/s per worker.

    throughput = total_num_tokens / (timing_raw["step"] * n_workers), counting every attended token
    (verl's `global_token_num`); `n_workers` is verl's `n_gpus` (worker processes on CPU).
    """
    if "step" not in timing_raw:
        raise KeyError("compute_throughput_metrics: timing_raw has no 'step' entry; wrap the whole iteration "
                       f"in `with timer('step', timing_raw)` (have {sorted(timing_raw)})")
    if n_workers < 1:
        raise ValueError(f"compute_throughput_metrics: n_workers must be >= 1, got {n_workers}")
    _require(batch, ("attention_mask",), "compute_throughput_metrics")
    total_tokens = int(batch.batch["attention_mask"].sum().item())
    seconds = float(timing_raw["step"])
    return {
        "perf/total_num_tokens": total_tokens,
        "perf/time_per_step": seconds,
        "perf/throughput": total_tokens / (seconds * n_workers),
    }


# verl's spelling, so code ported from verl's ray_trainer imports unchanged
compute_throughout_metrics = compute_throughput_metrics


def compute_memory_metrics(workers: Sequence[ProcessMemory] = (), driver: ProcessMemory | None = None
                           ) -> dict[str, float]:
    """Peak memory in GiB of the driver (default: this process) and the worker processes, each counted once
    (colocated roles share a process; under the local backend the driver is the worker).

    `perf/max_memory_rss_gb` is the driver's peak RSS, `/worker_max`, `/workers_sum` and `/all_processes`
    (sums of peaks bound the simultaneous total from above); `perf/max_memory_{allocated,reserved}_gb` the
    largest CUDA allocator peaks, per GPU as verl.
    """
    driver = driver or process_memory()
    metrics: dict[str, float] = {"perf/max_memory_rss_gb": driver.max_rss_gb}
    distinct_workers = {w.key: w for w in workers}
    if distinct_workers:
        rss = [w.max_rss_gb for w in distinct_workers.values()]
        metrics["perf/max_memory_rss_gb/worker_max"] = max(rss)
        metrics["perf/max_memory_rss_gb/workers_sum"] = sum(rss)
        every = {**distinct_workers, driver.key: driver}
        metrics["perf/max_memory_rss_gb/all_processes"] = sum(p.max_rss_gb for p in every.values())
    on_cuda = [p for p in (driver, *distinct_workers.values()) if p.cuda_max_allocated_gb is not None]
    if on_cuda:
        metrics["perf/max_memory_allocated_gb"] = max(p.cuda_max_allocated_gb for p in on_cuda)
        metrics["perf/max_memory_reserved_gb"] = max(p.cuda_max_reserved_gb for p in on_cuda)
    return metrics


def compute_mfu_metrics(flops: Mapping[str, float], seconds: Mapping[str, float],
                        peak_flops: Mapping[str, float]) -> dict[str, float]:
    """`perf/mfu/<pass>` = flops / (seconds x peak_flops) for each model pass that ran this step.

    flops: the pass's model FLOPs over the step's real tokens (`hybridrl.utils.metric.model_flops`);
    seconds: the slowest rank's own time; peak_flops: the sum of the ranks' peaks.
    """
    return {f"perf/mfu/{name}": mfu(value, seconds[name], peak_flops[name])
            for name, value in flops.items() if seconds.get(name, 0.0) > 0}


def compute_rollout_agreement_metrics(batch: DataProto) -> dict[str, float]:
    """`rollout/log_prob_diff_{max,mean}` of the rollout's against the actor's log-probs; {} when the batch
    lacks either (an engine that returns none), so the fit loop can call it unconditionally."""
    if batch.batch is None or not {"rollout_log_probs", "old_log_probs"} <= set(batch.batch.keys()):
        return {}
    _require(batch, ("response_mask",), "compute_rollout_agreement_metrics")
    # imported here: the rollout package pulls in the slow-to-import generation engines
    from hybridrl.workers.rollout.base import rollout_logprob_diff_metrics

    return rollout_logprob_diff_metrics(
        batch.batch["rollout_log_probs"], batch.batch["old_log_probs"], batch.batch["response_mask"]
    )


# ----- validation ----------------------------------------------------------------------------------


def _bootstrap(values: np.ndarray, preds: Sequence[Hashable] | None, k: int, seed: int,
               n: int = 1000) -> dict[str, float]:
    """best@k, worst@k and (with `preds`) maj@k: mean and std over `n` resamples of k responses with
    replacement of the max, the min, and the value of the majority-voted prediction (ties to the one seen
    first, valued as its first response: verl's `calc_maj_val`). Seeded as verl, without numpy's global RNG.
    """
    idx = np.random.RandomState(seed).choice(len(values), size=(n, k), replace=True)  # (n, k)
    picked = values[idx]
    estimates = {"best": picked.max(axis=1), "worst": picked.min(axis=1)}  # (n,) each
    if preds is not None:
        majority = np.empty(n)
        for row, sample in enumerate(idx):
            counts = Counter(preds[i] for i in sample)  # insertion order = first appearance
            winner = max(counts, key=counts.__getitem__)
            majority[row] = values[next(i for i in sample if preds[i] == winner)]
        estimates["maj"] = majority
    metrics: dict[str, float] = {}
    for name, draws in estimates.items():
        metrics[f"{name}@{k}/mean"], metrics[f"{name}@{k}/std"] = float(draws.mean()), float(draws.std())
    return metrics


def _prompt_metrics(
    values: np.ndarray, preds: Sequence[Hashable] | None, with_pass: bool, seed: int
) -> dict[str, float]:
    """mean@n, std@n, best@k, worst@k, maj@k (and pass@k) for one prompt's n responses."""
    n_resps = len(values)
    subset_sizes = [2**i for i in range(1, (n_resps - 1).bit_length())] + [n_resps]  # verl's: 2, 4, 8, ..., n
    metric = {f"mean@{n_resps}": float(values.mean())}
    if with_pass:
        correct = int((values > 0).sum())
        for k in [1, *subset_sizes] if n_resps > 1 else [1]:
            # unbiased pass@k (Chen et al. 2021, "Evaluating LLMs trained on code", eq. 1): the chance
            # that k of the n samples, drawn without replacement, include one of the c correct
            metric[f"pass@{k}"] = 1.0 - math.comb(n_resps - correct, k) / math.comb(n_resps, k)
    if n_resps == 1:
        return metric
    metric[f"std@{n_resps}"] = float(values.std())
    for k in subset_sizes:
        metric.update(_bootstrap(values, preds, k, seed))
    return metric


def process_validation_metrics(
    data_sources: Sequence[str],
    sample_uids: Sequence[Hashable],
    infos_dict: Mapping[str, Sequence[Any]],
    seed: int = 42,
) -> dict[str, dict[str, dict[str, float]]]:
    """`{data_source: {variable: {metric: value}}}` from per-response validation results.

    Responses are grouped by data source, then by prompt (`sample_uids`). Every numeric variable of
    `infos_dict` gets, per prompt of n responses, mean@n and for n > 1 std@n and bootstrap best@k, worst@k
    (and maj@k from a `pred` variable) for k = 2, 4, ... < n and n; the core variable (`acc`, else
    `reward`) also pass@k, a response counting as correct when > 0. A source's value is its prompts' mean.
    """
    n_rows = len(data_sources)
    for name, column in {"sample_uids": sample_uids, **infos_dict}.items():
        if len(column) != n_rows:
            raise ValueError(f"process_validation_metrics: {name} has {len(column)} entries but data_sources "
                             f"has {n_rows}; every list needs one entry per validation response")
    groups: dict[str, dict[Hashable, list[int]]] = defaultdict(lambda: defaultdict(list))
    for row, (source, uid) in enumerate(zip(data_sources, sample_uids, strict=True)):
        groups[source][uid].append(row)

    preds = infos_dict.get("pred")
    core_var = "acc" if "acc" in infos_dict else "reward"
    result: dict[str, dict[str, dict[str, float]]] = {}
    for source, prompts in groups.items():
        per_var: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for rows in prompts.values():
            for var_name, column in infos_dict.items():
                if isinstance(column[rows[0]], str):
                    continue
                values = np.asarray([column[r] for r in rows], dtype=float)  # (n_resps,)
                prompt_preds = [preds[r] for r in rows] if preds is not None else None
                for name, value in _prompt_metrics(values, prompt_preds, var_name == core_var, seed).items():
                    per_var[var_name][name].append(value)
        result[str(source)] = {  # str: numpy string keys from non_tensor_batch would leak into names
            var: {name: float(np.mean(vals)) for name, vals in metric_lists.items()}
            for var, metric_lists in per_var.items()
        }
    return result


def validation_metrics_to_flat(nested: Mapping[str, Mapping[str, Mapping[str, float]]]) -> dict[str, float]:
    """Flatten to `val-core/<source>/<var>/<metric>` and `val-aux/...` (verl's `_validate` naming): core
    are the mean@/maj@/best@/pass@ metrics at the largest n of the core variable (`acc`, else `reward`)."""
    flat = {}
    for source, var2metrics in nested.items():
        core_var = "acc" if "acc" in var2metrics else "reward"
        for var_name, metrics in var2metrics.items():
            n_max = max(int(name.split("@")[-1].split("/")[0]) for name in metrics)
            for name, value in metrics.items():
                is_core = (var_name == core_var and name.startswith(("mean", "maj", "best", "pass"))
                           and f"@{n_max}" in name)
                flat[f"{'val-core' if is_core else 'val-aux'}/{source}/{var_name}/{name}"] = value
    return flat


# The trainer's stages that run a model pass, and the pass's name in `perf/mfu/<name>`.
STAGE_PASSES = {"gen": "rollout", "old_log_prob": "actor_infer", "ref": "ref", "values": "critic_infer",
                "update_critic": "critic", "update_actor": "actor"}


def real_tokens(data: DataProto) -> int:
    """Attended (prompt + response) tokens of a batch: what the model FLOPs count."""
    return int(data.batch["attention_mask"].sum())


class StageCosts:
    """One step's worker seconds and model FLOPs per pass (a stage may run more than once), from every
    worker call's output (`record`), turned into `perf/mfu/<pass>` against the peaks the workers measured
    at start (`Worker.model_passes`) by `mfu_metrics`."""

    def __init__(self, passes: Mapping[str, ModelPass]) -> None:
        self.passes = dict(passes)
        self.flops: dict[str, float] = defaultdict(float)
        self.seconds: dict[str, float] = defaultdict(float)

    def start_step(self) -> None:
        self.flops.clear()
        self.seconds.clear()

    def record(self, stage: str, output: DataProto, tokens: int, timing: MutableMapping[str, float]) -> None:
        """File the workers' seconds of one `stage` call; count its FLOPs over `tokens` real tokens."""
        seconds = pop_worker_seconds(output.meta_info)
        if seconds is None:  # a worker class that does not time itself
            return
        name = worker_stage(stage)
        timing[name] = timing.get(name, 0.0) + seconds
        model_pass = self.passes.get(STAGE_PASSES.get(stage, ""))
        if model_pass is not None:
            self.flops[STAGE_PASSES[stage]] += model_pass.flops(tokens)
            self.seconds[STAGE_PASSES[stage]] += seconds

    def add(self, flops: Mapping[str, float], seconds: Mapping[str, float]) -> None:
        """Count another recorder's passes (a batch generated in the background) in this step."""
        for mine, theirs in ((self.flops, flops), (self.seconds, seconds)):
            for name, value in theirs.items():
                mine[name] += value

    def mfu_metrics(self) -> dict[str, float]:
        peaks = {name: p.peak_flops for name, p in self.passes.items()}
        return compute_mfu_metrics(self.flops, self.seconds, peaks)

LIMIT_KEY = "trainer.max_consecutive_skipped_steps"
STREAK_METRIC = "training/consecutive_skipped_steps"


class TrainingDivergedError(RuntimeError):
    """Too many training steps in a row had a non-finite loss or gradient norm."""


def unhealthy_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """The metrics that make a step unhealthy: non-finite losses and gradient norms, skipped updates.

    Matched by name, so every role is covered: a key whose last segment ends in `loss` or is `grad_norm`
    must be finite, and `skipped_step` (the share of the step's updates the engine skipped) must be 0.
    """
    def unhealthy(key: str, value: float) -> bool:
        name = key.rsplit("/", 1)[-1]
        if name == "skipped_step":
            return value != 0
        return (name.endswith("loss") or name == "grad_norm") and not math.isfinite(value)

    return {key: value for key, value in metrics.items() if unhealthy(key, value)}


@dataclass
class DivergenceGuard:
    """Counts unhealthy steps in a row and stops the run past `max_consecutive_skipped_steps`.

    `last_checkpoint()` names the newest committed checkpoint (or None) for the error; `hint` what to change.
    """

    max_consecutive_skipped_steps: int
    last_checkpoint: Callable[[], str | None]
    hint: str
    streak: int = 0

    def __post_init__(self) -> None:
        if self.max_consecutive_skipped_steps < 0:
            raise ValueError(f"{LIMIT_KEY} must be 0 or more (0 stops at the first non-finite step), got "
                             f"{self.max_consecutive_skipped_steps}")

    def check(self, step: int, metrics: dict[str, float], log: Callable[[], None] = lambda: None) -> bool:
        """True for a healthy step; False for a tolerated unhealthy one (do not save it); past the limit, calls
        `log` (the diverged step's numbers belong in the log too) and raises. Adds `STREAK_METRIC` to
        `metrics`."""
        bad = unhealthy_metrics(metrics)
        self.streak = self.streak + 1 if bad else 0
        metrics[STREAK_METRIC] = self.streak
        if not bad:
            return True
        shown = ", ".join(f"{key}={value:.4g}" for key, value in sorted(bad.items()))
        limit = self.max_consecutive_skipped_steps
        if self.streak > limit:
            checkpoint = self.last_checkpoint()
            # the update that led here had a finite norm but may be what ruined the model: say so
            where = (f"The last checkpoint is {checkpoint}; the update just before the first non-finite step "
                     f"may already have harmed it, so compare its logged loss and entropy with earlier steps "
                     f"before resuming from it" if checkpoint else "No checkpoint was saved before it")
            log()
            raise TrainingDivergedError(
                f"training diverged at step {step}: {shown} (non-finite, so the optimizer skipped those "
                f"updates); {self.streak} such step(s) in a row, and {LIMIT_KEY}={limit} allows {limit}. "
                f"Nothing of this step was saved. {where}. {self.hint}; or raise {LIMIT_KEY} to skip such "
                f"steps and go on"
            )
        logger.warning("step %d: %s; its update was skipped and it is not checkpointed (%d of %s=%d in a row)",
                       step, shown, self.streak, LIMIT_KEY, limit)
        return False
