"""The numbers workers report and the trainer reduces: metric lists, and the time each stage took.

A worker reports each metric once per micro-batch or mini-batch (and concat gathers the ranks'
reports), so a metric arrives as a list: `reduce_metrics` takes the mean, or the max / min for keys
named so, and a value that must be summed instead travels as a `Metric` that carries its own
aggregation. Stage times follow verl's `marked_timer` convention: the fit loop wraps each stage in
`with timer("gen", timing_raw): ...`, and a worker's own share of a stage rides back in its output's
metrics (`report_worker_seconds`) to be filed as `<stage>_worker`.

Model FLOPs utilisation is here too: MFU = model FLOPs / (seconds x the devices' peak FLOP/s), with
~2N FLOPs per real token for a forward pass and ~6N for forward plus backward over the N parameters that
multiply (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", section 2.1; attention scores
left out, so long contexts read slightly low). Padding and recomputation lower MFU rather than inflate
it, as in verl and PaLM. The peak is the datasheet figure on GPUs listed here, otherwise the best of a
few square matmuls in the compute dtype with this process's threads.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

import numpy as np
import torch
from torch import nn

from hybridrl.utils.device import device_type as process_device_type

# FLOPs per parameter per token (Kaplan et al. 2020, section 2.1)
FORWARD_FLOPS_PER_PARAM = 2
TRAIN_FLOPS_PER_PARAM = 6

# Dense (no sparsity) tensor-core peaks from NVIDIA's datasheets, FLOP/s, keyed by a substring of
# torch.cuda.get_device_name() in lower case (the lookup lower-cases the name). fp32 is the plain
# (non-TF32) figure: torch does not use TF32 for matmuls unless torch.backends.cuda.matmul.allow_tf32 is
# set. First match wins, so the more specific names come first.
_GPU_PEAKS: tuple[tuple[str, dict[torch.dtype, float]], ...] = (
    ("h100 pcie", {torch.bfloat16: 756e12, torch.float16: 756e12, torch.float32: 51e12}),
    ("h100", {torch.bfloat16: 989e12, torch.float16: 989e12, torch.float32: 67e12}),  # SXM
    ("h200", {torch.bfloat16: 989e12, torch.float16: 989e12, torch.float32: 67e12}),
    ("a100", {torch.bfloat16: 312e12, torch.float16: 312e12, torch.float32: 19.5e12}),
)


def model_flops(params: int, tokens: int, flops_per_param: int, passes: int = 1) -> float:
    """FLOPs of `passes` passes of a model with `params` multiplying parameters over `tokens` tokens.

    flops = flops_per_param x params x tokens x passes, with flops_per_param 2 for a forward pass
    (generation, log-probs, values) and 6 for forward + backward (an update; `passes` = its epochs).
    E.g. 1M parameters, 1,000 tokens, one training epoch: 6 x 1e6 x 1e3 = 6e9 FLOPs.
    """
    return float(flops_per_param) * params * tokens * passes


def mfu(flops: float, seconds: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: flops / (seconds x peak_flops), the share of the peak the work used.

    `peak_flops` is the sum over the processes that shared the work (each rank's peak), `seconds` the
    wall time of the slowest (they finish together: FSDP's collectives keep ranks in lockstep).
    """
    if seconds <= 0 or peak_flops <= 0:
        raise ValueError(f"mfu needs positive seconds and peak_flops, got {seconds} and {peak_flops}")
    return flops / (seconds * peak_flops)


def matmul_params(model: nn.Module) -> int:
    """Parameters that multiply each token: all of them except an input embedding not tied to the head.

    An embedding lookup does no arithmetic, but the output head multiplies every token by the whole
    vocabulary matrix; with tied embeddings that matrix is the input embedding, counted once.
    (A checkpoint's stored parameter count is the same number for tied models.)
    """
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    embedding = get_in() if callable(get_in) else None
    head = get_out() if callable(get_out) else None
    if embedding is None or (head is not None and head.weight is embedding.weight):
        return total
    return total - embedding.weight.numel()


def matmul_peak_flops(dtype: torch.dtype = torch.float32, device: str = "cpu", size: int = 2048,
                      repeats: int = 6) -> float:
    """The best FLOP/s of `repeats` (size x size) @ (size x size) matmuls (2 x size^3 FLOPs each).

    Runs with this process's current torch thread count; the first matmul (allocation, kernel warm-up)
    is not timed. A private generator fills the matrices, so probing leaves torch's global random
    state (and with it a run's sampling) untouched.
    """
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device, dtype)  # (size, size)
    b = torch.randn(size, size, generator=generator).to(device, dtype)  # (size, size)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    torch.matmul(a, b)
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def datasheet_peak_flops(device_name: str, dtype: torch.dtype) -> float | None:
    """The datasheet's dense peak of a known GPU in `dtype`, or None (names match case-insensitively)."""
    device_name = device_name.lower()
    for name, peaks in _GPU_PEAKS:
        if name in device_name:
            return peaks.get(dtype)
    return None


@functools.cache
def _cached_peak(device_type: str, dtype: torch.dtype, threads: int) -> float:
    if device_type == "cuda":
        known = datasheet_peak_flops(torch.cuda.get_device_name(), dtype)
        return known if known is not None else matmul_peak_flops(dtype, "cuda", size=8192)
    return matmul_peak_flops(dtype, "cpu")


def device_peak_flops(dtype: torch.dtype) -> float:
    """This process's peak FLOP/s in `dtype` on its device: measured once per (dtype, thread count).

    CUDA: the datasheet figure of a known GPU, else a measured one; CPU: measured with the current
    torch thread count (a rank's share of the cores).
    """
    return _cached_peak(process_device_type(), dtype, torch.get_num_threads())


@dataclass(frozen=True)
class ModelPass:
    """One kind of model pass a worker runs (a generation, a log-prob pass, an update), for MFU.

    flops_per_param: 2 (forward) or 6 (forward + backward); passes: over the data per call (an
    update's epochs); peak_flops: the process's peak in the pass's compute dtype.
    """

    params: int
    flops_per_param: int
    passes: int
    peak_flops: float

    def flops(self, tokens: int) -> float:
        return model_flops(self.params, tokens, self.flops_per_param, self.passes)


def combine_ranks(per_rank: Sequence[Mapping[str, ModelPass]]) -> dict[str, ModelPass]:
    """One group's passes from its ranks' reports: the same model on every rank, the peaks summed."""
    combined: dict[str, ModelPass] = {}
    for report in per_rank:
        for name, rank_pass in report.items():
            seen = combined.get(name)
            if seen is None:
                combined[name] = rank_pass
                continue
            if (seen.params, seen.flops_per_param, seen.passes) != \
                    (rank_pass.params, rank_pass.flops_per_param, rank_pass.passes):
                raise ValueError(f"the ranks disagree on the {name!r} pass: {seen} vs {rank_pass}")
            combined[name] = replace(seen, peak_flops=seen.peak_flops + rank_pass.peak_flops)
    return combined


class AggregationType(str, Enum):
    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


class Metric:
    """Values of one metric together with how to reduce them (`aggregate()`).

    For values that `reduce_metrics` must not average: a loss already divided by the whole mini-batch's
    token count, whose micro-batch parts add up to the mini-batch loss, travels as a SUM metric.
    """

    def __init__(self, aggregation: str | AggregationType, value: Any = None) -> None:
        self.aggregation = AggregationType(aggregation)  # raises on an unknown name
        self.values: list[float] = []
        if isinstance(value, (list, tuple, Metric)):
            self.extend(value)
        elif value is not None:
            self.append(value)

    def __repr__(self) -> str:
        return f"Metric({self.aggregation.value}, {self.values})"

    def append(self, value: Any) -> None:
        if isinstance(value, Metric):
            self.extend(value)
            return
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"a metric value must be a scalar, got a tensor of shape {tuple(value.shape)}")
            value = value.detach().item()
        if not isinstance(value, (int, float, np.number)):
            raise TypeError(f"a metric value must be a number, got {type(value).__name__}")
        self.values.append(float(value))

    def extend(self, values: Metric | Iterable[Any]) -> None:
        if isinstance(values, Metric):
            if values.aggregation != self.aggregation:
                raise ValueError(f"cannot merge a {values.aggregation.value} metric into a {self.aggregation.value} one")
            values = values.values
        for value in values:
            self.append(value)

    def init_list(self) -> Metric:
        """An empty Metric with the same aggregation (what append_to_dict starts a key with)."""
        return Metric(self.aggregation)

    def aggregate(self) -> float:
        if not self.values:
            return math.nan
        reduce = {AggregationType.MEAN: np.mean, AggregationType.SUM: np.sum,
                  AggregationType.MIN: np.min, AggregationType.MAX: np.max}[self.aggregation]
        return float(reduce(self.values))


def _reduction(key: str) -> str:
    tokens = key.rsplit("/", 1)[-1].split("_")
    return "max" if "max" in tokens else "min" if "min" in tokens else "mean"


def reduce_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """One number per key from the per-micro-batch (or per-rank) lists the workers return.

    A `Metric` reduces by its own aggregation. A plain list takes the mean, except for keys whose last
    path segment has a `max` or `min` word (`response_length/max`, `perf/max_memory_rss_gb`), which
    take the max or min, as newer verl does: the mean of per-rank maxima is not a maximum. An empty
    list gives NaN (nothing was measured).
    """
    reduced = {}
    for key, values in metrics.items():
        if isinstance(values, Metric):
            reduced[key] = values.aggregate()
            continue
        array = np.asarray(values if isinstance(values, (list, tuple, np.ndarray)) else [values], float)
        if array.size == 0:
            reduced[key] = math.nan
            continue
        reduced[key] = float(getattr(np, _reduction(key))(array))
    return reduced


def append_to_dict(data: MutableMapping[str, Any], new_data: Mapping[str, Any], prefix: str = "") -> None:
    """Append each of new_data's values to the list (or Metric) under the same key in data, in place.

    A list value is extended rather than nested. `prefix` is put before keys that do not have it yet.
    """
    for key, value in new_data.items():
        name = key if key.startswith(prefix) else f"{prefix}{key}"
        if name not in data:
            data[name] = value.init_list() if isinstance(value, Metric) else []
        if isinstance(value, list):
            data[name].extend(value)
        else:
            data[name].append(value)


# The key under meta_info["metrics"] that carries a rank's own seconds for one call. Inside `metrics`
# because concatenating the ranks' outputs gathers metrics into one list per key (rank order), where
# any other meta_info key must be equal on every rank.
WORKER_SECONDS = "worker_seconds"


@contextmanager
def timer(name: str, timing_raw: MutableMapping[str, float]) -> Iterator[None]:
    """Add the seconds spent in the `with` body to `timing_raw[name]` (created at 0.0 if absent).

    `compute_timing_metrics` turns the step's `timing_raw` into `timing_s/<stage>` and
    `timing_per_token_ms/<stage>`. verl's stage names are `step`, `gen`, `reward`, `old_log_prob`, `ref`,
    `values`, `adv`, `update_critic`, `update_actor`, `testing` and `save_checkpoint`; `step` spans the
    whole iteration and is what `compute_throughput_metrics` divides by.

    Accumulating rather than overwriting matters when a stage runs several times in one step (DAPO's
    dynamic sampling generates until the batch is full). The time is recorded even when the body raises,
    so a crash report still shows how long the failing stage ran.
    """
    start = time.perf_counter()  # monotonic: immune to wall-clock adjustments during long runs
    try:
        # a named range in a torch.profiler trace (benchmarks/profile_step.py); next to nothing otherwise
        with torch.profiler.record_function(name):
            yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + (time.perf_counter() - start)


@contextmanager
def marked_timer(
    name: str, timing_raw: MutableMapping[str, float], color: str | None = None
) -> Iterator[None]:
    """verl's signature (`color` names an NVTX range colour there); here it is the same as `timer`.

    There are no NVTX profiler ranges on CPU, so `color` is accepted and ignored to keep verl call sites
    working unchanged.
    """
    del color
    with timer(name, timing_raw):
        yield


def worker_stage(stage: str) -> str:
    """The timing name of a stage's time on the workers: `gen` -> `gen_worker` (`timing_s/gen_worker`).

    The trainer files the slowest rank's time under it, so `timing_s/gen` and `timing_s/gen_worker` sit
    side by side and their difference is what dispatch, transfer and collection cost.
    """
    return f"{stage}_worker"


def report_worker_seconds(method: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a worker method returning a DataProto: its wall time goes into the output's metrics.

    Apply it below `@register`, so the time covers the method's own work and not the fetching of its
    input shards.
    """

    @functools.wraps(method)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        output = method(*args, **kwargs)
        output.meta_info.setdefault("metrics", {})[WORKER_SECONDS] = [time.perf_counter() - start]
        return output

    return timed


def pop_worker_seconds(meta_info: MutableMapping[str, Any]) -> float | None:
    """Take the ranks' seconds out of a collected output's metrics; the slowest rank's, or None if absent.

    The maximum is the honest wall time: ranks meet in collectives, so the call ends with the slowest.
    Drops `metrics` when nothing else is left in it.
    """
    metrics = meta_info.get("metrics")
    if not metrics or WORKER_SECONDS not in metrics:
        return None
    seconds = metrics.pop(WORKER_SECONDS)
    if not metrics:
        del meta_info["metrics"]
    return float(max(seconds)) if isinstance(seconds, (list, tuple)) else float(seconds)
