"""Model FLOPs and the device's peak: what model FLOPs utilisation (MFU) is made of.

MFU = model FLOPs of the useful work / (seconds x the peak FLOP/s of the devices that did it). The model
FLOPs come from Kaplan et al. 2020, "Scaling Laws for Neural Language Models", section 2.1: a dense
transformer with N parameters that multiply spends ~2N FLOPs per token on a forward pass and ~6N on a
forward plus backward pass (the backward costs twice the forward). Only real (attended) tokens count,
so padding and recomputation (gradient checkpointing) lower MFU rather than inflate it, as in verl and
in PaLM's definition of MFU.

The attention scores add ~2 x layers x context x hidden FLOPs per token on a forward pass; they are left
out (for the tiny models of this project they are under 5% of 2N), so the figures are slightly low for
long contexts.

The peak is the datasheet figure on GPUs this module knows, otherwise a measured one: the best of a few
square matmuls in the compute dtype with this process's torch thread count (on CPU there is no
datasheet figure that means anything: it depends on the cores and threads a process gets).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

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
