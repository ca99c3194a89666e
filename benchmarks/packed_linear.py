"""Packed oneDNN linears against F.linear on this CPU: single calls, then whole generations of the HF engine.

    .venv/bin/python benchmarks/packed_linear.py            # bf16 and fp32, 1 and 2 threads, 10m and 50m
    .venv/bin/python benchmarks/packed_linear.py --quick    # fewer calls, the 1m generation only

What it compares (hybridrl/models/onednn_linear.py is the code under test):

- one linear call, rows x in x out as a decoding step of the 10m / 50m presets and a training micro-batch
  meet them: `F.linear` against `torch.ops.mkldnn._linear_pointwise` over the weight packed once
  (the pack's own time is shown beside them), median of `--calls` calls each, alternating blocks;
- one `HFRollout.generate_sequences` call (16 prompts x 8 samples x 64 tokens at 10m, 8 x 8 x 64 at 50m,
  the same seed): the engine as it is (packed) against the engine with packing turned off (this script
  swaps `hf.prepacked_linears` for an empty context), alternating, median of `--runs`; it checks both
  sampled the same tokens and reports the largest log-prob difference.

Every figure is taken with `torch.set_num_threads(t)` for each t in `--threads`, in this one process.
Writes results/packed_linear.md; prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_vs_trl import machine, publish  # noqa: E402  (a sibling script, not a package)
from rollout_bench import make_prompts  # noqa: E402

from hybridrl.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from hybridrl.models.onednn_linear import packing_supported  # noqa: E402
from hybridrl.models.tiny import build_tiny_model  # noqa: E402
from hybridrl.workers.rollout import HFRollout, RolloutConfig  # noqa: E402
from hybridrl.workers.rollout import hf as hf_engine  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "packed_linear.md"
SHAPES = [(128, 256, 1024), (128, 1024, 256), (64, 512, 2048), (64, 2048, 512), (4096, 512, 2048)]
GENERATIONS = {"1m": 4, "10m": 16, "50m": 8}  # size -> prompts per call (x 8 samples x 64 tokens)


def median_us(fn: Callable[[], object], calls: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def linear_row(m: int, k: int, n: int, dtype: torch.dtype, threads: int, calls: int) -> str:
    ops = torch.ops.mkldnn
    x, weight = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
    packed = ops._reorder_linear_weight(weight)

    def plain_call() -> torch.Tensor:
        return F.linear(x, weight)

    def packed_call() -> torch.Tensor:
        return ops._linear_pointwise(x, packed, None, "none", [], "")

    plain_us, packed_us = [], []
    for _ in range(3):  # alternating blocks, so drift hits both alike
        plain_us.append(median_us(plain_call, calls))
        packed_us.append(median_us(packed_call, calls))
    pack_us = median_us(lambda: ops._reorder_linear_weight(weight), max(calls // 5, 3))
    plain, fast = statistics.median(plain_us), statistics.median(packed_us)
    exact = torch.equal(plain_call(), packed_call())
    gflop = 2 * m * k * n / 1e3
    return (f"| {m} x {k} x {n} | {str(dtype).removeprefix('torch.')} | {threads} | {plain:.0f} "
            f"({gflop / plain:.0f}) | {fast:.0f} ({gflop / fast:.0f}) | {plain / fast:.2f}x | "
            f"{pack_us:.0f} | {'yes' if exact else 'no'} |")


def generation_row(size: str, model_dir: Path, dtype: str, threads: int, runs: int) -> str:
    tokenizer = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, dtype=torch.float32)  # the trainer's fp32 weights; rollout.dtype casts
    prompts = make_prompts(tokenizer, GENERATIONS[size], 40)
    prompts.meta_info["seed"] = 0  # the same sampler stream in every call
    engine = HFRollout(model, RolloutConfig(response_length=64, n=8, temperature=1.0, dtype=dtype), tokenizer)
    packing = hf_engine.prepacked_linears

    def generate(packed: bool):
        hf_engine.prepacked_linears = packing if packed else (lambda module: contextlib.nullcontext(0))
        try:
            start = time.perf_counter()
            out = engine.generate_sequences(prompts)
            return time.perf_counter() - start, out.batch
        finally:
            hf_engine.prepacked_linears = packing

    generate(False), generate(True)  # warm-up
    times: dict[bool, list[float]] = {False: [], True: []}
    outputs = {}
    for _ in range(runs):
        for packed in (False, True):
            seconds, outputs[packed] = generate(packed)
            times[packed].append(seconds)
    same = torch.equal(outputs[False]["responses"], outputs[True]["responses"])
    gap = (outputs[False]["rollout_log_probs"] - outputs[True]["rollout_log_probs"]).abs().max().item()
    plain, fast = statistics.median(times[False]), statistics.median(times[True])
    return (f"| {size} | {dtype} | {threads} | {plain:.3f} | {fast:.3f} | {plain / fast:.2f}x | "
            f"{'yes' if same else 'no'} | {gap:.1e} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 calls, 1 run, the 1m generation only")
    parser.add_argument("--threads", default="1,2", help="torch thread counts to measure at")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--calls", type=int, default=100, help="calls per linear timing")
    parser.add_argument("--runs", type=int, default=3, help="generations per engine setting")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    calls, runs = (20, 1) if args.quick else (args.calls, args.runs)
    sizes = ["1m"] if args.quick else ["10m", "50m"]
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    missing = [str(d) for d in dtypes if not packing_supported(torch.zeros(2, 2, dtype=d))]
    if missing:
        raise SystemExit(f"no packed oneDNN linear here for {', '.join(missing)} (x86-64 CPUs with oneDNN only)")
    threads = [int(t) for t in args.threads.split(",")]
    linear = ["| rows x in x out | dtype | threads | F.linear us (GFLOP/s) | packed us (GFLOP/s) | speedup | "
              "pack us | bit-equal |", "|---|---|---:|---:|---:|---:|---:|---|"]
    generation = ["| size | rollout.dtype | threads | plain s | packed s | speedup | same tokens | "
                  "max log-prob gap |", "|---|---|---:|---:|---:|---:|---|---:|"]
    with tempfile.TemporaryDirectory(prefix="packed-linear-") as tmp:
        models = {size: build_tiny_model(Path(tmp) / size, size=size) for size in sizes}
        for t in threads:
            torch.set_num_threads(t)
            for dtype in dtypes:
                linear += [linear_row(*shape, dtype, t, calls) for shape in SHAPES]
                for size in sizes:
                    generation.append(generation_row(size, models[size], str(dtype).removeprefix("torch."), t, runs))
                    print(generation[-1], flush=True)
    text = "\n".join([
        f"Packed oneDNN linears vs F.linear on a {machine('cpu')}, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d')}; `{' '.join(['benchmarks/packed_linear.py', *(argv or sys.argv[1:])])}`.",
        "", "One linear call (median of each of 3 alternating blocks of calls, then their median):", "", *linear,
        "", "One generation of the HF engine (8 samples x 64 tokens per prompt; 10m: 16 prompts, 50m: 8), "
        "packing on and off alternately, median of the runs:", "", *generation, ""])
    publish(text, args.out)


if __name__ == "__main__":
    main()
