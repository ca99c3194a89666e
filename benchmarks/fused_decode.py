"""The HF engine's three ways to run a decoding step on a CPU, side by side: the model's forward, the fused
step, and the fused step with each prompt's keys/values kept once for its samples.

    .venv/bin/python benchmarks/fused_decode.py            # 10m and 50m, 3 prompt lengths, 1 and 2 threads
    .venv/bin/python benchmarks/fused_decode.py --quick    # 1m, 2 prompt lengths, 1 thread, 1 run (~1 min)

What it compares (hybridrl/workers/rollout/fused_decoder.py and hf.py are the code under test): one
`HFRollout.generate_sequences` call, 16 prompts x 8 samples x 64 new tokens, temperature 1, the same seed,
rollout.dtype `--dtype` over the fp32 weights (default: bf16 where the CPU multiplies it natively, fp32
on one that emulates it, see hybridrl/utils/device.py), three settings alternating in one process:

- forward: every step after the prefill through the model's forward (this script swaps
  `hf.fused_decoder` for one that declines);
- fused: `FusedDecoder.step`, the prompts' keys/values copied per sample (`share_prompt_kv_from=None`);
- shared: `FusedDecoder.step_shared` at every prompt length (`share_prompt_kv_from=1`; the engine's own
  threshold is `HFRollout.share_prompt_kv_from`).

Prompts are an arithmetic question repeated 1, 4 or 12 times (11, 47 and 143 tokens). Each cell is the
median of `--runs` generations; "same as forward" says whether the fused step sampled the forward's tokens
and log-probs bit for bit; the last columns are the mean |log-prob| gap between what each setting sampled
and the fp32 model's own log-probs of those tokens (one full forward over prompt + response, as the
trainer's old-log-prob pass computes them). Writes results/fused_decode.md; prints the table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_vs_trl import machine, publish  # noqa: E402  (a sibling script, not a package)

from hybridrl.data.rl_dataset import left_pad  # noqa: E402
from hybridrl.models.loading import load_causal_lm, load_tokenizer, resolve_dtype  # noqa: E402
from hybridrl.models.tiny import build_tiny_model  # noqa: E402
from hybridrl.protocol import DataProto  # noqa: E402
from hybridrl.utils.device import native_bf16  # noqa: E402
from hybridrl.workers.rollout import HFRollout, RolloutConfig  # noqa: E402
from hybridrl.workers.rollout import hf as hf_engine  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "fused_decode.md"
SETTINGS = ("forward", "fused", "shared")
PROMPTS, SAMPLES, NEW_TOKENS = 16, 8, 64


def repeated_prompts(tokenizer, repeats: int) -> DataProto:
    """PROMPTS questions, each said `repeats` times, left-padded to the longest as RLHFDataset does."""
    texts = [" ".join([f"What is {i * 37 % 100} + {i * 53 % 1000}?"] * repeats) for i in range(PROMPTS)]
    ids = [tokenizer(t)["input_ids"] for t in texts]
    rows = [left_pad(row, max(map(len, ids)), tokenizer.pad_token_id) for row in ids]
    input_ids, mask, positions = (torch.stack(col) for col in zip(*rows, strict=True))
    return DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask, "position_ids": positions},
                               meta_info={"seed": 0})


def model_log_prob_gap(model: torch.nn.Module, batch) -> float:
    """Mean over response tokens of |sampled log-prob - the fp32 model's log-prob of that token|."""
    prompt_len = batch["prompts"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits[:, prompt_len - 1 : -1].float()
    reference = torch.log_softmax(logits, -1).gather(-1, batch["responses"][..., None]).squeeze(-1)
    mask = batch["response_mask"].bool()
    return (batch["rollout_log_probs"] - reference).abs()[mask].mean().item()


def generate(engine: HFRollout, prompts: DataProto, setting: str) -> tuple[float, dict]:
    real = hf_engine.fused_decoder
    if setting == "forward":
        hf_engine.fused_decoder = lambda model: None
    engine.share_prompt_kv_from = 1 if setting == "shared" else None
    try:
        start = time.perf_counter()
        out = engine.generate_sequences(prompts)
        return time.perf_counter() - start, out.batch
    finally:
        hf_engine.fused_decoder = real


def rows_for(size: str, model_dir: Path, threads: int, repeats: list[int], runs: int, dtype: str) -> list[str]:
    tokenizer = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, dtype=torch.float32)  # the trainer's fp32 weights; rollout.dtype casts
    config = RolloutConfig(response_length=NEW_TOKENS, n=SAMPLES, temperature=1.0, dtype=dtype)
    engine = HFRollout(model, config, tokenizer)
    rows = []
    for repeat in repeats:
        prompts = repeated_prompts(tokenizer, repeat)
        for setting in SETTINGS:  # warm-up
            generate(engine, prompts, setting)
        times: dict[str, list[float]] = {s: [] for s in SETTINGS}
        batches = {}
        for _ in range(runs):
            for setting in SETTINGS:
                seconds, batches[setting] = generate(engine, prompts, setting)
                times[setting].append(seconds)
        med = {s: statistics.median(times[s]) for s in SETTINGS}
        same = torch.equal(batches["forward"]["responses"], batches["fused"]["responses"]) and torch.equal(
            batches["forward"]["rollout_log_probs"], batches["fused"]["rollout_log_probs"])
        gaps = [model_log_prob_gap(model, batches[s]) for s in SETTINGS]
        rows.append(f"| {size} | {prompts.batch['input_ids'].shape[1]} | {threads} | {med['forward']:.3f} | "
                    f"{med['fused']:.3f} ({med['forward'] / med['fused']:.2f}x) | "
                    f"{med['shared']:.3f} ({med['forward'] / med['shared']:.2f}x) | {'yes' if same else 'no'} | "
                    + " | ".join(f"{g:.4f}" for g in gaps) + " |")
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1m, prompts said 1 and 4 times, 1 thread, 1 run")
    parser.add_argument("--sizes", default="10m,50m")
    parser.add_argument("--threads", default="1,2", help="torch thread counts to measure at")
    parser.add_argument("--repeats", default="1,4,12", help="how many times each prompt says its question")
    parser.add_argument("--runs", type=int, default=3, help="generations per setting and prompt length")
    parser.add_argument("--dtype", default=None,
                        help="rollout.dtype: bfloat16 or float32 (default bfloat16 where the CPU multiplies it natively)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    dtype = str(resolve_dtype(args.dtype or ("bfloat16" if native_bf16("cpu") else "float32"))).removeprefix("torch.")
    sizes, threads = args.sizes.split(","), [int(t) for t in args.threads.split(",")]
    repeats, runs = [int(r) for r in args.repeats.split(",")], args.runs
    if args.quick:
        sizes, threads, repeats, runs = ["1m"], [1], [1, 4], 1
    table = ["| size | prompt tokens | threads | forward s | fused s | shared s | fused = forward | "
             "log-prob gap: forward | fused | shared |", "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    with tempfile.TemporaryDirectory(prefix="fused-decode-") as tmp:
        for size in sizes:
            model_dir = build_tiny_model(Path(tmp) / size, size=size)
            for t in threads:
                torch.set_num_threads(t)
                table += rows_for(size, model_dir, t, repeats, runs, dtype)
    text = "\n".join([
        f"HF engine decoding steps on a {machine('cpu')}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}; "
        f"`{' '.join(['benchmarks/fused_decode.py', *(argv if argv is not None else sys.argv[1:])])}`.",
        "", f"One generation, {PROMPTS} prompts x {SAMPLES} samples x {NEW_TOKENS} new tokens, {dtype} over fp32 "
        f"weights (untrained models), the three settings alternating, median of {runs} run(s); speedups over "
        "forward. Log-prob gap: mean |sampled log-prob - the fp32 model's log-prob of the token|.",
        "", *table, ""])
    publish(text, args.out)


if __name__ == "__main__":
    main()
