"""Decoding speed of the HF rollout against the memory-bandwidth limit: eager steps vs CUDA graphs.

    python benchmarks/decode_bandwidth.py --device cuda [--sizes 10m,50m,400m,1b] [--dtype bfloat16]
    python benchmarks/decode_bandwidth.py --device cpu --sizes 10m      (eager only: no graphs on a CPU)

One decoding step must read every weight once and each row's keys and values so far; at the batch sizes
of RL rollouts that is the floor of a step's time on a GPU. Per step this counts those bytes (weights in
the compute dtype, plus the KV cache positions attention reads: all of them for the graphed loop, which
reads whole buffers, as the eager one does on a CPU; the written prefix for the eager one on a GPU) and divides by the measured time per step:
the achieved bandwidth, printed against the device's, measured in the same run by a large device-to-
device copy (bytes read plus written).

Work: `--prompts` prompts x `--n` samples, `--new-tokens` tokens each with EOS ignored (every row decodes
to the end, so the eager loop drops no row and both variants do the same steps), temperature 1.0, on an
untrained tiny Qwen2 preset. Times are medians of `--runs` calls after one warm-up call, each call the
HF rollout's whole `generate_sequences` (prefill and sampling included; the graphed variant's capture
too, since it happens once per call). In fp32 the two variants' greedy tokens are also compared.

Writes benchmarks/results/decode_bandwidth_<device>.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from grpo_vs_trl import default_dtypes, machine
from rollout_bench import make_prompts

from hybridrl.models.loading import load_causal_lm, load_tokenizer, resolve_dtype
from hybridrl.models.tiny import build_tiny_model
from hybridrl.workers.rollout import HFRollout

RESULTS = Path(__file__).parent / "results"


def copy_bandwidth(device: torch.device, gib: float = 1.0, repeats: int = 10) -> float:
    """Bytes per second of a device-to-device copy of `gib` GiB, counting bytes read and written."""
    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - start)
    return 2 * src.numel() / statistics.median(times)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kv_bytes_per_step(config, rows: int, prompt_len: int, new_tokens: int, dtype: torch.dtype,
                      whole_buffers: bool) -> float:
    """Mean bytes of keys and values attention reads per decoding step, over the steps."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_position = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * dtype.itemsize * rows
    # the eager loop's prefix grows from P+1 to P+R positions over the R steps
    positions = prompt_len + new_tokens if whole_buffers else prompt_len + (new_tokens + 1) / 2
    return per_position * positions


def bench(size: str, args, device: torch.device, workdir: Path) -> list[dict]:
    model_dir = build_tiny_model(workdir / size, arch="qwen2", size=size, seed=0)
    tokenizer = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, dtype="float32").eval().to(device)
    dtype = resolve_dtype(args.dtype)
    weight_bytes = sum(p.numel() for p in model.parameters()) * dtype.itemsize
    prompts = make_prompts(tokenizer, args.prompts, args.prompt_length).to(device)
    rows = args.prompts * args.n
    variants = {"eager": True, "cuda graphs": False} if device.type == "cuda" else {"eager": True}
    out, greedy = [], {}
    for name, eager in variants.items():
        config = {"response_length": args.new_tokens, "n": args.n, "dtype": args.dtype, "ignore_eos": True,
                  "enforce_eager": eager, "seed": 0}
        engine = HFRollout(model, config, tokenizer)
        engine.generate_sequences(prompts)  # warm-up: allocator, library handles
        times = []
        for _ in range(args.runs):
            sync(device)
            start = time.perf_counter()
            engine.generate_sequences(prompts)
            sync(device)
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        step_s = seconds / args.new_tokens
        step_bytes = weight_bytes + kv_bytes_per_step(model.config, rows, args.prompt_length, args.new_tokens,
                                                      dtype, whole_buffers=not eager or device.type == "cpu")
        out.append({"size": size, "variant": name, "params": weight_bytes / dtype.itemsize, "s": seconds,
                    "tokens_per_s": rows * args.new_tokens / seconds, "ms_per_step": step_s * 1e3,
                    "gb_per_step": step_bytes / 1e9, "gb_per_s": step_bytes / step_s / 1e9})
        if dtype == torch.float32:
            greedy_engine = HFRollout(model, {**config, "do_sample": False, "n": 1}, tokenizer)
            greedy[name] = greedy_engine.generate_sequences(prompts).batch["responses"]
    if len(greedy) == 2:
        same = (greedy["eager"] == greedy["cuda graphs"]).float().mean().item()
        for row in out:
            row["greedy_match"] = same
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--sizes", default="10m,50m,400m,1b")
    parser.add_argument("--dtype", default=None,
                        help="rollout.dtype (default bfloat16, or float32 on a CPU that emulates bf16)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-length", type=int, default=40)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="default results/decode_bandwidth_<device>.md")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU")
    args.dtype = args.dtype or default_dtypes(args.device).split(",")[-1]
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    bandwidth = copy_bandwidth(device, gib=1.0 if device.type == "cuda" else 0.25)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            size_rows = bench(size, args, device, Path(tmp))
            rows += size_rows
            for row in size_rows:
                print(f"{row['size']:>4} {row['variant']:<11} {row['ms_per_step']:8.2f} ms/step "
                      f"{row['tokens_per_s']:10.0f} tok/s {row['gb_per_s']:8.1f} GB/s", flush=True)
    lines = [
        f"HF rollout decoding on {machine(args.device)}, torch {torch.__version__}, {args.dtype}, "
        f"{args.prompts} prompts x {args.n} samples x {args.new_tokens} new tokens (EOS ignored), prompts "
        f"{args.prompt_length} tokens, medians of {args.runs} calls after a warm-up, {time.strftime('%Y-%m-%d')}. "
        f"Device-to-device copy in this run: {bandwidth / 1e9:.0f} GB/s (read + written). GB/step: the weights "
        "in the compute dtype plus the keys/values attention reads (whole buffers for the graphed loop and on a "
        "CPU, the written prefix for the eager loop on a GPU).",
        "",
        "| size (params) | decoding | ms/step | tokens/s | GB/step | achieved GB/s | % of copy bandwidth | greedy tokens equal (fp32) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        match = f"{row['greedy_match']:.3f}" if "greedy_match" in row else "-"
        lines.append(f"| {row['size']} ({row['params'] / 1e6:.0f}M) | {row['variant']} | {row['ms_per_step']:.2f} | "
                     f"{row['tokens_per_s']:.0f} | {row['gb_per_step']:.3f} | {row['gb_per_s']:.1f} | "
                     f"{100 * row['gb_per_s'] * 1e9 / bandwidth:.1f}% | {match} |")
    text = "\n".join(lines)
    out = args.out or RESULTS / f"decode_bandwidth_{args.device}.md"
    out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
