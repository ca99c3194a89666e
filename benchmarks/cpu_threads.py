"""How many torch threads each worker process should use on a small CPU machine.

    python benchmarks/cpu_threads.py --model runs/quickstart/sft/global_step_600/actor/huggingface

Runs the quickstart's per-step work (generation, log-prob recomputation and one PPO update of a
16 prompts x 8 samples batch) on real gloo ranks with FSDP2, for each layout of ranks x threads, and
prints the median seconds per step. On a 2-core machine the layouts are 1x1, 1x2, 2x1 and 2x2
(the last oversubscribes the cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def step_times(rank: int, world: int, rendezvous: str, threads: int, model_dir: str, steps: int, out: str) -> None:
    from hybridrl.models.loading import load_causal_lm, load_tokenizer
    from hybridrl.protocol import DataProto
    from hybridrl.workers.actor import PPOActor
    from hybridrl.workers.config import ActorConfig, FSDPConfig, OptimConfig
    from hybridrl.workers.fsdp_engine import FSDPEngine
    from hybridrl.workers.rollout import RolloutConfig, build_rollout
    from hybridrl.workers.update_loop import BatchingPlan

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    tokenizer = load_tokenizer(model_dir)
    engine = FSDPEngine(load_causal_lm(model_dir), FSDPConfig(), OptimConfig(lr=1e-6))
    actor = PPOActor(ActorConfig(), engine)
    rollout = build_rollout(RolloutConfig(n=8, prompt_length=40, response_length=64, seed=rank),
                            module=engine.module, tokenizer=tokenizer)
    prompts_per_rank = 16 // world
    text = [tokenizer.apply_chat_template([{"role": "user", "content": f"Compute {17 + i} + {58 + 3 * i} column by "
                                            "column; put the result in <answer></answer>."}],
                                          add_generation_prompt=True, tokenize=False) for i in range(prompts_per_rank)]
    enc = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in text]
    ids = torch.zeros(prompts_per_rank, 40, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(enc):
        ids[i, 40 - len(e):] = torch.tensor(e)
        mask[i, 40 - len(e):] = 1
    prompts = DataProto.from_dict({"input_ids": ids, "attention_mask": mask,
                                   "position_ids": (mask.cumsum(1) - 1).clamp(min=0)})
    times = []
    for _ in range(steps + 1):
        dist.barrier()
        start = time.perf_counter()
        with engine.summon_full_params():
            batch = rollout.generate_sequences(prompts)
        batch.meta_info["temperature"] = 1.0
        log_probs, _ = actor.compute_log_prob(batch, 64, None)
        batch.batch["old_log_probs"] = log_probs
        batch.batch["advantages"] = torch.randn(len(batch), 1) * batch.batch["response_mask"]
        actor.update_policy(batch, BatchingPlan(mini_batch_rows=len(batch) // 2, micro_batch_rows=32))
        dist.barrier()
        times.append(time.perf_counter() - start)
    if rank == 0:
        Path(out).write_text(str(statistics.median(times[1:])))  # the first step warms up
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    layouts = [(1, 1), (1, cores), (cores, 1), (cores, cores)] if cores > 1 else [(1, 1)]
    print(f"| ranks x threads per rank ({cores} cores) | seconds per step (median of {args.steps}) |")
    print("| --- | ---: |")
    for world, threads in layouts:
        with tempfile.NamedTemporaryFile() as out, tempfile.TemporaryDirectory() as rendezvous:
            mp.start_processes(step_times, args=(world, f"{rendezvous}/store", threads, args.model, args.steps,
                                                 out.name), nprocs=world, join=True, start_method="spawn")
            print(f"| {world} x {threads} | {float(Path(out.name).read_text()):.2f} |", flush=True)


if __name__ == "__main__":
    main()
