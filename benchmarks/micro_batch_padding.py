"""How much forward/backward compute the actor's micro-batching saves on padding.

    python benchmarks/micro_batch_padding.py --model runs/quickstart/sft/global_step_600/actor/huggingface \
        --data runs/quickstart/data/train.parquet

Samples one quickstart-sized batch (16 prompts x 8 responses) with the rollout engine, then counts the
token positions a padded forward pass pays for (rows x width, summed over micro-batches) three ways:
the full padded batch, micro-batches in arrival order trimmed to their used columns, and the actor's
length-sorted, trimmed micro-batches. The real tokens are the lower bound.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from hybridrl.data.rl_dataset import RLHFDataset, collate_fn  # noqa: E402
from hybridrl.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from hybridrl.protocol import DataProto  # noqa: E402
from hybridrl.workers.micro_batch import make_micro_batches, trim_columns  # noqa: E402
from hybridrl.workers.rollout import RolloutConfig, build_rollout  # noqa: E402


def trimmed_cost(parts: list[DataProto], response_length: int) -> int:
    return sum(len(p) * trim_columns(p, response_length).input_ids.shape[1] for p in parts if len(p))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=40)
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--micro", type=int, default=32, help="rows per micro-batch (per rank)")
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.model)
    dataset = RLHFDataset(args.data, tokenizer, {"max_prompt_length": args.prompt_length})
    items = collate_fn([dataset[i] for i in range(args.prompts)])
    prompts = DataProto.from_dict({k: items[k] for k in ("input_ids", "attention_mask", "position_ids")})
    config = RolloutConfig(n=args.n, prompt_length=args.prompt_length, response_length=args.response_length)
    with torch.no_grad():
        batch = build_rollout(config, module=load_causal_lm(args.model), tokenizer=tokenizer).generate_sequences(prompts)
    rows, width = batch.batch["input_ids"].shape
    real = int(batch.batch["attention_mask"].sum())
    in_order = trimmed_cost(batch.split(args.micro), args.response_length)
    sorted_trimmed = trimmed_cost([mb.data for mb in make_micro_batches(batch, args.micro)], args.response_length)
    print(f"| micro-batching ({rows} rows, width {width}, micro-batches of {args.micro}) | token positions | vs padded |")
    print("| --- | ---: | ---: |")
    for name, cost in [("full padded batch", rows * width), ("arrival order, trimmed", in_order),
                       ("length-sorted, trimmed (the actor's)", sorted_trimmed), ("real tokens (lower bound)", real)]:
        print(f"| {name} | {cost} | {cost / (rows * width):.2f} |")


if __name__ == "__main__":
    main()
