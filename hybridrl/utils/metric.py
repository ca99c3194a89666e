"""The numbers workers report and the trainer reduces: metric lists, stage times and MFU (model FLOPs over
seconds x peak FLOP/s; attention left out, as in verl)."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from hybridrl.utils.device import device_type as process_device_type

# FLOPs per parameter per token (Kaplan et al. 2020, section 2.1)
FORWARD_FLOPS_PER_PARAM = 2
TRAIN_FLOPS_PER_PARAM = 6

# Dense datasheet peaks in FLOP/s by a substring of the lower-cased name (first match); fp32 without TF32, as torch
_GPU_PEAKS: tuple[tuple[str, dict[torch.dtype, float]], ...] = (
    ("h100 pcie", {torch.bfloat16: 756e12, torch.float16: 756e12, torch.float32: 51e12}),
    ("h100", {torch.bfloat16: 989e12, torch.float16: 989e12, torch.float32: 67e12}),  # SXM
    ("h200", {torch.bfloat16: 989e12, torch.float16: 989e12, torch.float32: 67e12}),
    ("a100", {torch.bfloat16: 312e12, torch.float16: 312e12, torch.float32: 19.5e12}),
)


def model_flops(params: int, tokens: int, flops_per_param: int, passes: int = 1) -> float:
    """flops_per_param (2 forward, 6 forward + backward) x params x tokens x passes (an update's epochs)."""
    return float(flops_per_param) * params * tokens * passes


def mfu(flops: float, seconds: float, peak_flops: float) -> float:
    """flops / (seconds x peak_flops): the ranks' summed peaks, the slowest rank's seconds."""
    if seconds <= 0 or peak_flops <= 0:
        raise ValueError(f"mfu needs positive seconds and peak_flops, got {seconds} and {peak_flops}")
    return flops / (seconds * peak_flops)


def matmul_params(model: nn.Module) -> int:
    """Parameters that multiply each token: all but an input embedding not tied to the output head (a lookup
    does no arithmetic; a tied one is the head's matrix, counted once)."""
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    embedding = get_in() if callable(get_in) else None
    head = get_out() if callable(get_out) else None
    if embedding is None or (head is not None and head.weight is embedding.weight):
        return total
    return total - embedding.weight.numel()


def matmul_peak_flops(dtype: torch.dtype = torch.float32, device: str = "cpu", max_size: int = 1024,
                      repeats: int = 6, target_s: float = 0.02) -> float:
    """The best FLOP/s of `repeats` square matmuls after an untimed warm-up, with the current torch thread
    count. The side doubles from 256 to `max_size` while one matmul takes under `target_s`: a CPU reaches
    its peak by 1024, and a dtype it only emulates (bf16 without AVX512_BF16) stays at well under a
    second instead of minutes. A private generator leaves the global random state alone."""
    generator = torch.Generator().manual_seed(0)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def seconds(a: torch.Tensor, b: torch.Tensor) -> float:
        start = time.perf_counter()
        torch.matmul(a, b)
        sync()
        return time.perf_counter() - start

    size = 256
    while True:
        a = torch.randn(size, size, generator=generator).to(device, dtype)  # (size, size)
        b = torch.randn(size, size, generator=generator).to(device, dtype)  # (size, size)
        seconds(a, b)  # warm-up: first-call packing and kernel selection
        if size >= max_size or seconds(a, b) >= target_s:
            break
        size *= 2
    return 2 * size**3 / min(seconds(a, b) for _ in range(repeats))


def datasheet_peak_flops(device_name: str, dtype: torch.dtype) -> float | None:
    """The datasheet's dense peak of a known GPU in `dtype`, or None (names match case-insensitively)."""
    lowered = device_name.lower()
    return next((peaks.get(dtype) for name, peaks in _GPU_PEAKS if name in lowered), None)


@functools.cache
def _cached_peak(device_type: str, dtype: torch.dtype, threads: int) -> float:
    if device_type == "cuda":
        known = datasheet_peak_flops(torch.cuda.get_device_name(), dtype)
        return known if known is not None else matmul_peak_flops(dtype, "cuda", max_size=8192)
    return matmul_peak_flops(dtype, "cpu")


def device_peak_flops(dtype: torch.dtype) -> float:
    """This process's peak FLOP/s in `dtype` (a known GPU's datasheet figure, else measured), cached."""
    return _cached_peak(process_device_type(), dtype, torch.get_num_threads())


@dataclass(frozen=True)
class ModelPass:
    """One kind of model pass a worker runs (generation, log-probs, an update), for MFU; `passes` counts
    passes over the data per call (an update's epochs), `peak_flops` is in the pass's compute dtype."""

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
            elif replace(seen, peak_flops=rank_pass.peak_flops) != rank_pass:  # another model or pass count
                raise ValueError(f"the ranks disagree on the {name!r} pass: {seen} vs {rank_pass}")
            else:
                combined[name] = replace(seen, peak_flops=seen.peak_flops + rank_pass.peak_flops)
    return combined


def reduce_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """One number per key: a list's mean, or max / min where the key's last path segment has a `max` / `min`
    word (the mean of per-rank maxima is not a maximum); empty gives NaN."""
    reduced = {}
    for key, values in metrics.items():
        array = np.asarray(values if isinstance(values, (list, tuple, np.ndarray)) else [values], float)
        words = key.rsplit("/", 1)[-1].split("_")
        reduction = "max" if "max" in words else "min" if "min" in words else "mean"
        reduced[key] = float(getattr(np, reduction)(array)) if array.size else math.nan
    return reduced


# A rank's own seconds for one call, inside meta_info["metrics"], which concat gathers per rank.
WORKER_SECONDS = "worker_seconds"


@contextmanager
def timer(name: str, timing_raw: MutableMapping[str, float]) -> Iterator[None]:
    """Add the `with` body's seconds to `timing_raw[name]`, also when it raises (a stage may repeat in a step)."""
    start = time.perf_counter()
    try:
        # a named range in a torch.profiler trace (benchmarks/profile_step.py); next to nothing otherwise
        with torch.profiler.record_function(name):
            yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + (time.perf_counter() - start)


def worker_stage(stage: str) -> str:
    """The timing name of a stage's slowest-rank time on the workers (`gen` -> `gen_worker`)."""
    return f"{stage}_worker"


def report_worker_seconds(method: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a worker method returning a DataProto so its wall time goes into the output's metrics; apply it
    below `@register`, so the time excludes fetching the input."""

    @functools.wraps(method)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        output = method(*args, **kwargs)
        output.meta_info.setdefault("metrics", {})[WORKER_SECONDS] = [time.perf_counter() - start]
        return output

    return timed


def pop_worker_seconds(meta_info: MutableMapping[str, Any]) -> float | None:
    """Pop the ranks' seconds from collected metrics (an emptied `metrics` goes): the slowest's, or None."""
    metrics = meta_info.get("metrics")
    if not metrics or WORKER_SECONDS not in metrics:
        return None
    seconds = metrics.pop(WORKER_SECONDS)
    if not metrics:
        del meta_info["metrics"]
    return float(max(seconds)) if isinstance(seconds, (list, tuple)) else float(seconds)
