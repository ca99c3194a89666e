"""The HF rollout of a LoRA actor: adapters merged for the generation (what the engine does) against decoding
through PEFT's adapter layers, with the plain model beside them.

    python benchmarks/lora_generation.py [--sizes 1m,10m] [--dtypes float32,bfloat16] [--rank 8] [--runs 5]

Each size is an untrained tiny model (hybridrl/models/tiny.py) with LoRA adapters (all-linear, lora_B
random, as after training). Three paths generate the same work (32 prompts x 8 samples x 64 new tokens,
temperature 1) with `HFRollout`: `plain` (the model without adapters), `LoRA merged` (the engine as it is:
`merged_for_generation` swaps in plain linears holding W + (alpha/r) B A, so the fused CPU step runs) and
`LoRA adapter forward` (that swap patched out: every step goes through the LoRA layers' forward).
Median tokens/s over `--runs` alternating runs, one torch thread by default (`--threads`).
Writes `benchmarks/results/lora_generation.md`.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from learning import cpu_name  # noqa: E402
from rollout_bench import make_prompts, measure  # noqa: E402

from hybridrl.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from hybridrl.models.lora import LoRASettings, add_lora  # noqa: E402
from hybridrl.models.tiny import build_tiny_model  # noqa: E402
from hybridrl.workers.rollout import HFRollout, RolloutConfig  # noqa: E402
from hybridrl.workers.rollout import hf as hf_rollout  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "lora_generation.md"


def lora_model(model_dir: Path, rank: int) -> torch.nn.Module:
    model = add_lora(load_causal_lm(model_dir), LoRASettings(rank=rank, alpha=2 * rank))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.normal_(0, 0.02, generator=torch.Generator().manual_seed(len(name)))
    return model


def generate(model, tokenizer, prompts, dtype: str, merged: bool, seed: int) -> int:
    """One generation's response tokens; `merged=False` decodes through the LoRA layers' forward."""
    config = RolloutConfig(response_length=64, n=8, temperature=1.0, seed=seed, dtype=dtype)
    swap = contextlib.nullcontext() if merged else _no_merge()
    with swap:
        out = HFRollout(model, config, tokenizer).generate_sequences(prompts)
    return int(out.batch["response_mask"].sum())


@contextlib.contextmanager
def _no_merge():
    original = hf_rollout.merged_for_generation
    hf_rollout.merged_for_generation = lambda module, **kwargs: contextlib.nullcontext()
    try:
        yield
    finally:
        hf_rollout.merged_for_generation = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1m,10m")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows, ratios = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            model_dir = build_tiny_model(Path(tmp) / size, arch="qwen2", size=size, seed=0)
            tokenizer = load_tokenizer(model_dir, padding_side="left")
            prompts = make_prompts(tokenizer, 32, 32)
            plain, adapted = load_causal_lm(model_dir), lora_model(model_dir, args.rank)
            for dtype in args.dtypes.split(","):
                paths = {"plain": (plain, True), "LoRA merged": (adapted, True),
                         "LoRA adapter forward": (adapted, False)}
                rates = measure({name: partial(generate, model, tokenizer, prompts, dtype, merge)
                                 for name, (model, merge) in paths.items()}, runs=args.runs, warmup=1)
                merged, forward = rates["LoRA merged"][0], rates["LoRA adapter forward"][0]
                ratios.append(merged / forward)
                rows.append(f"| {size} | {dtype} | {rates['plain'][0]:,.0f} | {merged:,.0f} | {forward:,.0f} | "
                            f"{merged / forward:.2f} |")
                print(rows[-1], flush=True)
    text = "\n".join([
        "# LoRA generation: merged adapters against the adapter forward",
        "",
        f"CPU: {cpu_name()}; {args.threads} torch thread(s); command: "
        f"`{shlex.join(['python', 'benchmarks/lora_generation.py', *sys.argv[1:]])}`; nothing else ran on the machine.",
        f"HFRollout, 32 prompts x 8 samples x 64 new tokens, LoRA rank {args.rank} all-linear; median tokens/s "
        f"over {args.runs} alternating runs.",
        "",
        "| size | dtype | plain | LoRA merged | LoRA adapter forward | merged / forward |",
        "|---|---|---:|---:|---:|---:|",
        *rows,
        "",
        f"Merged over the adapter forward: median {statistics.median(ratios):.2f}x, min {min(ratios):.2f}x.",
        "",
    ])
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
