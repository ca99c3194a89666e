"""The HF engine's continuous batch (streaming mode's decoding) against generating a batch at a time, on responses
whose lengths have a long tail: the rollout side of async_vs_sync.py alone.

    python benchmarks/continuous_batching.py [--size 10m] [--prompts 64] [--repeats 3] [--threads 1,2]

The same model (async_vs_sync.long_tail_model: untrained, EOS pulled up, so lengths spread geometrically up to
256 tokens) samples 8 responses for each of `--prompts` arithmetic prompts two ways, one after the other and
`--repeats` times, in this process with `--threads` torch threads: a batch at a time (16 prompts x 8 = 128 rows
per `generate_sequences`, which waits for its longest row while finished rows leave the batch), and continuously
(`HFRollout.stream`, 128 rows at once, a finished row's slot taken by the next prompt's sample at once). Reported:
response tokens/s and samples/s, medians over the repeats, and their ratio. Writes
`benchmarks/results/continuous_batching.md`. Run on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
N, ROWS, LENGTH = 8, 128, 256


def prompt_batch(tokenizer, data: Path, count: int):
    import numpy as np
    import pyarrow.parquet as pq

    from hybridrl.data.rl_dataset import left_pad
    from hybridrl.protocol import DataProto

    rows = pq.read_table(data / "train.parquet").to_pylist()[:count]
    texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    padded = [left_pad(tokenizer(t)["input_ids"], 128, tokenizer.pad_token_id) for t in texts]
    ids, mask, pos = (torch.stack(column) for column in zip(*padded, strict=True))
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos},
                               {"uid": np.array([str(i) for i in range(count)], dtype=object)})


def batch_at_a_time(rollout, prompts) -> tuple[float, int, int]:
    """(seconds, response tokens, samples) generating ROWS / N prompts per call."""
    start, tokens, samples = time.perf_counter(), 0, 0
    for first in range(0, len(prompts), ROWS // N):
        out = rollout.generate_sequences(prompts.select_rows(list(range(first, first + ROWS // N))))
        tokens += int(out.batch["response_mask"].sum())
        samples += len(out)
    return time.perf_counter() - start, tokens, samples


def continuously(rollout, prompts) -> tuple[float, int, int]:
    """(seconds, response tokens, samples) streaming every prompt through one continuous batch of ROWS rows."""
    rollout.continuous = None
    start, tokens, samples = time.perf_counter(), 0, 0
    first = prompts
    while first is not None or rollout.continuous.in_flight:
        out = rollout.stream(first, version=0, max_steps=32)
        first = None
        if out is not None:
            tokens += int(out.batch["response_mask"].sum())
            samples += len(out)
    return time.perf_counter() - start, tokens, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="10m")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--workdir", default="runs/continuous_batching")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "benchmarks"))
    from async_vs_sync import LONG_TAIL_EOS_PULL, long_tail_model
    from learning import cpu_name
    from lora_memory import prepare

    from hybridrl.models.loading import load_causal_lm, load_tokenizer
    from hybridrl.workers.rollout import HFRollout

    workdir = Path(args.workdir).resolve()
    model_dir, data = prepare(workdir, args.size)
    model_dir = long_tail_model(model_dir, workdir / f"model_{args.size}_long_tail")
    tokenizer, model = load_tokenizer(model_dir), load_causal_lm(model_dir, dtype="float32").eval()
    prompts = prompt_batch(tokenizer, data, args.prompts)
    config = {"response_length": LENGTH, "prompt_length": 128, "n": N, "dtype": "float32", "max_num_seqs": ROWS}
    command = shlex.join(["python", "benchmarks/continuous_batching.py", *sys.argv[1:]])
    lines = [
        "# Continuous batching against a batch at a time (the HF engine, long-tail responses)",
        "",
        f"CPU: {cpu_name()}; command: `{command}`; nothing else ran on the machine. Model: {args.size}, untrained, "
        f"EOS pulled up (eos_pull={LONG_TAIL_EOS_PULL}), fp32; {args.prompts} prompts x {N} samples, up to "
        f"{LENGTH} response tokens. A batch at a time: {ROWS // N} prompts x {N} = {ROWS} rows per "
        f"generate_sequences. Continuous: HFRollout.stream with max_num_seqs={ROWS}. Medians over {args.repeats} "
        "repeats, the two ways alternating.",
        "",
        "| torch threads | way | seconds | response tokens | mean length | tokens/s | samples/s | x batch at a time |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        runs: dict[str, list[tuple[float, int, int]]] = {"batch at a time": [], "continuous": []}
        for repeat in range(args.repeats):
            for name, way in (("batch at a time", batch_at_a_time), ("continuous", continuously)):
                rollout = HFRollout(model, {**config, "seed": repeat}, tokenizer)
                runs[name].append(way(rollout, prompts))
        base = None
        for name, results in runs.items():
            seconds = statistics.median(r[0] for r in results)
            tokens = statistics.median(r[1] for r in results)
            per_s = statistics.median(r[1] / r[0] for r in results)
            samples_per_s = statistics.median(r[2] / r[0] for r in results)
            base = base or per_s
            lines.append(f"| {threads} | {name} | {seconds:.1f} | {tokens:.0f} | {tokens / (args.prompts * N):.1f} | "
                         f"{per_s:.0f} | {samples_per_s:.1f} | {per_s / base:.2f} |")
            print(lines[-1], flush=True)
    lines.append("")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "continuous_batching.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
