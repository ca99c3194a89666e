"""Generation throughput: hybridrl's HF rollout engine vs plain `model.generate` on identical work.

    python benchmarks/rollout_bench.py            # 64 prompts x 8 samples x 128 new tokens, 10m and 50m,
                                                  # in float32 and bfloat16
    python benchmarks/rollout_bench.py --quick    # a reduced run (16 x 4 x 32) to check it works
    python benchmarks/rollout_bench.py --dtypes float32   # the fp32 headline only

Both engines get the same left-padded prompts, the same model object, the same sampling (temperature,
no top-k, no top-p), the same EOS id and the same max new tokens. Throughput counts each engine's own
response tokens (up to and including EOS), so an engine is never credited for padding. The models are
untrained tiny models built with `hybridrl.models.tiny` in a temporary directory.

Each dtype loads the model in that dtype and runs both engines on it (a fair comparison). For a
dtype other than float32 a third row runs our engine on the float32 model with `rollout.dtype` set
to that dtype, as the trainer does (fp32 actor weights, cast once per `generate_sequences` call).

Writes the table to benchmarks/results/rollout_bench.md; the last printed line is
`speedup vs model.generate: <ratio>x`, the smaller of the per-size ratios of median tokens/s in
float32 (the headline: the trainer's default).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from hybridrl.data.rl_dataset import left_pad  # noqa: E402
from hybridrl.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from hybridrl.models.tiny import build_tiny_model  # noqa: E402
from hybridrl.protocol import DataProto  # noqa: E402
from hybridrl.workers.rollout import HFRollout, RolloutConfig  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "rollout_bench.md"


def make_prompts(tokenizer, count: int, length: int) -> DataProto:
    """`count` arithmetic questions of varied length, left-padded to `length` as RLHFDataset does."""
    texts = [f"What is {i * 37 % 100} + {i * 53 % 1000}? Answer digit by digit." for i in range(count)]
    rows = [left_pad(tokenizer(t)["input_ids"][:length], length, tokenizer.pad_token_id) for t in texts]
    ids, mask, pos = (torch.stack(col) for col in zip(*rows, strict=True))
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos})


def response_tokens(new_tokens: torch.Tensor, eos: int) -> int:
    """Tokens up to and including the first EOS in each row of (rows, steps)."""
    hit = new_tokens == eos
    lengths = torch.where(hit.any(1), hit.int().argmax(1) + 1, torch.tensor(new_tokens.shape[1]))
    return int(lengths.sum())


def run_ours(model, tokenizer, prompts: DataProto, args, seed: int, dtype: str) -> int:
    config = RolloutConfig(
        response_length=args.new_tokens, n=args.n, temperature=args.temperature, seed=seed, dtype=dtype
    )
    out = HFRollout(model, config, tokenizer).generate_sequences(prompts)
    return int(out.batch["response_mask"].sum())


def run_generate(model, tokenizer, prompts: DataProto, args, seed: int, dtype: str) -> int:
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            input_ids=prompts.batch["input_ids"],
            attention_mask=prompts.batch["attention_mask"],
            do_sample=True,
            temperature=args.temperature,
            top_k=0,  # off, as in our engine (the generation config's default would be 50)
            top_p=1.0,
            num_return_sequences=args.n,
            max_new_tokens=args.new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    return response_tokens(out[:, prompts.batch["input_ids"].shape[1] :], tokenizer.eos_token_id)


def measure(fns: dict[str, Callable[[int], int]], runs: int, warmup: int) -> dict[str, tuple[float, int]]:
    """Median tokens/s of each engine over `runs` timed runs (after `warmup` untimed ones), and the
    last run's tokens. The engines alternate run by run, so load from other processes on the machine
    hits both alike instead of whichever happens to run during it."""
    rates: dict[str, list[float]] = {name: [] for name in fns}
    tokens: dict[str, int] = {}
    for i in range(warmup):
        for fn in fns.values():
            fn(-1 - i)
    for seed in range(runs):
        for name, fn in fns.items():
            start = time.perf_counter()
            tokens[name] = fn(seed)
            rates[name].append(tokens[name] / (time.perf_counter() - start))
    return {name: (statistics.median(rates[name]), tokens[name]) for name in fns}


Row = tuple[str, str, str, int, float]  # (size, dtype, engine, tokens/run, tokens/s)


def bench_size(size: str, dtype: str, workdir: Path, args) -> list[Row]:
    model_dir = workdir / size
    if not model_dir.exists():
        build_tiny_model(model_dir, arch="qwen2", size=size, seed=0)
    model = load_causal_lm(model_dir, dtype=dtype).eval()
    tokenizer = load_tokenizer(model_dir)
    prompts = make_prompts(tokenizer, args.prompts, args.prompt_length)
    fns = {
        "model.generate": partial(run_generate, model, tokenizer, prompts, args, dtype=dtype),
        "hybridrl hf": partial(run_ours, model, tokenizer, prompts, args, dtype=dtype),
    }
    if dtype != "float32":
        fp32_model = load_causal_lm(model_dir, dtype="float32").eval()
        fns["hybridrl hf, fp32 weights"] = partial(run_ours, fp32_model, tokenizer, prompts, args, dtype=dtype)
    rows = []
    for name, (rate, tokens) in measure(fns, args.runs, args.warmup).items():
        rows.append((size, dtype, name, tokens, rate))
        print(f"{size:>4} {dtype:>8}  {name:<26} {tokens:>7} tokens/run  {rate:9.1f} tokens/s", flush=True)
    return rows


def render(rows: list[Row], args) -> tuple[str, float]:
    """The markdown table, and the headline: the smallest float32 speedup over model.generate."""
    lines = [
        f"Rollout throughput, {args.prompts} prompts x {args.n} samples x {args.new_tokens} new tokens, "
        f"prompt length {args.prompt_length}, temperature {args.temperature}, "
        f"median of {args.runs} runs after {args.warmup} warm-up, {torch.get_num_threads()} torch threads. "
        "Speedup is against model.generate on the same model in the same dtype.",
        "",
        "| model | dtype | engine | tokens/run | tokens/s | speedup |",
        "|---|---|---|---:|---:|---:|",
    ]
    headline = []
    for size, dtype in dict.fromkeys((r[0], r[1]) for r in rows):
        group = [r for r in rows if r[0] == size and r[1] == dtype]
        base = next(r[4] for r in group if r[2] == "model.generate")
        for _, _, name, tokens, rate in group:
            lines.append(f"| {size} | {dtype} | {name} | {tokens} | {rate:.0f} | {rate / base:.2f}x |")
            if name == "hybridrl hf" and dtype == "float32":
                headline.append(rate / base)
    if not headline:
        raise SystemExit("the headline needs float32 in --dtypes")
    return "\n".join(lines) + "\n", min(headline)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 prompts x 4 samples x 32 tokens, 1 run")
    parser.add_argument("--sizes", default="10m,50m", help="tiny-model presets to compare")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs before the timed ones")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--dtypes", default="float32,bfloat16",
                        help="model and generation dtypes to compare, each on both engines (float32 required)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.n, args.new_tokens, args.runs = 16, 4, 32, 1
    with tempfile.TemporaryDirectory() as tmp:
        rows = [
            row
            for size in args.sizes.split(",")
            for dtype in args.dtypes.split(",")
            for row in bench_size(size, dtype, Path(tmp), args)
        ]
    table, ratio = render(rows, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    print(table)
    print(f"speedup vs model.generate: {ratio:.2f}x")


if __name__ == "__main__":
    main()
