"""Peak memory of a GRPO run's processes, full fine-tune against LoRA, and the size of the optimizer state.

    python benchmarks/lora_memory.py [--sizes 50m,400m] [--rank 8] [--dtype fp32] [--workdir runs/lora_memory]

For each tiny-model size (hybridrl/models/tiny.py; untrained weights are enough to measure memory) four
short GRPO runs (2 steps, 4 prompts x 2 samples, 16 response tokens, 2 Ray workers, computing and
generating in `--dtype` with fp32 master weights, no validation, no checkpoint), each in a fresh process: the full fine-tune and LoRA (`lora_rank`, all-linear), each with
the reference policy (`use_kl_loss=true`) and without it. Reported: the driver's and the workers' peak
resident memory (`perf/max_memory_rss_gb*`, each process's high-water mark over the run, loading
included). The reference's cost is the difference a reference makes: a second model for the full
fine-tune, nothing for LoRA (its reference is the actor's base with the adapters off).

Then, in this process on a one-rank gloo group, one optimizer step of the FSDP engine with and without
LoRA: the bytes of AdamW's state against the trainable parameters (AdamW keeps two fp32 moments per
trainable value, so state = 8 bytes x trainable values, plus a step counter per tensor).
Writes `benchmarks/results/<--out>.md` (default `lora_memory`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from learning import cpu_name  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
RSS_KEYS = ("perf/max_memory_rss_gb", "perf/max_memory_rss_gb/worker_max", "perf/max_memory_rss_gb/workers_sum",
            "perf/max_memory_rss_gb/all_processes")


def prepare(workdir: Path, size: str) -> tuple[Path, Path]:
    from hybridrl.models.tiny import build_tiny_model

    model, data = workdir / f"model_{size}", workdir / "data"
    if not (model / "config.json").exists():
        build_tiny_model(model, arch="qwen2", size=size, seed=0)
    if not (data / "train.parquet").exists():
        subprocess.run([sys.executable, "-m", "hybridrl.data.tasks.arithmetic", "--out", str(data),
                        "--train-size", "64", "--test-size", "8"], check=True, capture_output=True)
    return model, data


def grpo_run(workdir: Path, model: Path, data: Path, name: str, rank: int, kl: bool, dtype: str) -> dict:
    run = workdir / name
    subprocess.run([
        sys.executable, "-m", "hybridrl.trainer.main_ppo", "algorithm.adv_estimator=grpo",
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
        f"actor_rollout_ref.model.path={model}", "data.train_batch_size=4", "data.max_response_length=16",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        f"actor_rollout_ref.actor.use_kl_loss={str(kl).lower()}", f"actor_rollout_ref.model.lora_rank={rank}",
        "actor_rollout_ref.model.lora_alpha=16", "trainer.total_training_steps=2", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "trainer.save_freq=-1", "trainer.logger=[file]",
        "trainer.resume_mode=disable", f"trainer.default_local_dir={run}", "trainer.device=cpu",
        f"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype={dtype}",
        f"actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype={dtype}", f"actor_rollout_ref.rollout.dtype={dtype}",
    ], check=True, capture_output=True, cwd=REPO)
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    return {key: last[key] for key in RSS_KEYS}


def optimizer_state(model_dir: Path, rank: int) -> dict:
    """One AdamW step of the engine on a one-rank gloo group: trainable values and the state's bytes."""
    import torch
    import torch.distributed as dist

    from hybridrl.models.loading import load_causal_lm
    from hybridrl.models.lora import LoRASettings, add_lora
    from hybridrl.workers.config import FSDPConfig, OptimConfig
    from hybridrl.workers.fsdp_engine import FSDPEngine

    with tempfile.TemporaryDirectory() as rendezvous:
        os.environ.setdefault("LOCAL_RANK", "0")
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}/store", rank=0, world_size=1)
        try:
            model = load_causal_lm(model_dir)
            if rank:
                model = add_lora(model, LoRASettings(rank=rank, alpha=16))
            engine = FSDPEngine(model, FSDPConfig(), OptimConfig(lr=1e-4))
            ids = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))
            engine.module(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
            engine.clip_and_step()
            values = sum(p.numel() for p in engine.module.parameters() if p.requires_grad)
            state_bytes = sum(t.numel() * t.element_size() for s in engine.optimizer.state.values()
                              for t in s.values() if torch.is_tensor(t))
            total = sum(p.numel() for p in engine.module.parameters())
        finally:
            dist.destroy_process_group()
    return {"trainable": values, "parameters": total, "state_bytes": state_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50m,400m")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--dtype", default="fp32", help="compute and rollout dtype (master weights stay fp32)")
    parser.add_argument("--out", default="lora_memory", help="results file stem under benchmarks/results/")
    parser.add_argument("--workdir", default="runs/lora_memory")
    args = parser.parse_args()
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "benchmarks/lora_memory.py", *sys.argv[1:]])
    lines = [
        "# Peak memory: full fine-tune against LoRA",
        "",
        f"CPU: {cpu_name()}; command: `{command}`; LoRA rank {args.rank}, alpha 16, all-linear; compute and "
        f"rollout in {args.dtype}, master weights fp32 (LoRA's frozen base in the compute dtype); nothing else ran "
        "on the machine.",
        "GRPO 2 steps, 4 prompts x 2 samples, 16 response tokens, 2 Ray workers. Peak resident memory (GB) of the "
        "driver, the larger worker and the two workers summed; 'ref' runs have use_kl_loss=true.",
        "",
        "| size | run | driver | worker max | workers sum | all processes |",
        "|---|---|---:|---:|---:|---:|",
    ]
    summary, state_lines = [], []
    for size in args.sizes.split(","):
        model, data = prepare(workdir, size)
        runs = {}
        for name, rank, kl in (("full + ref", 0, True), ("LoRA + ref", args.rank, True),
                               ("full", 0, False), ("LoRA", args.rank, False)):
            runs[name] = grpo_run(workdir, model, data, f"{size}_{args.dtype}_{name.replace(' + ', '_')}", rank, kl,
                                  args.dtype)
            r = runs[name]
            lines.append(f"| {size} | {name} | {r[RSS_KEYS[0]]:.2f} | {r[RSS_KEYS[1]]:.2f} | {r[RSS_KEYS[2]]:.2f} | "
                         f"{r[RSS_KEYS[3]]:.2f} |")
            print(lines[-1], flush=True)
        worker = RSS_KEYS[1]
        summary.append(
            f"- {size}: LoRA / full, worker peak with the reference: "
            f"{runs['LoRA + ref'][worker] / runs['full + ref'][worker]:.2f}; the reference adds "
            f"{runs['full + ref'][worker] - runs['full'][worker]:+.2f} GB per worker to the full fine-tune and "
            f"{runs['LoRA + ref'][worker] - runs['LoRA'][worker]:+.2f} GB to LoRA.")
        for rank in (0, args.rank):
            s = optimizer_state(model, rank)
            state_lines.append(
                f"| {size} | {'LoRA' if rank else 'full'} | {s['parameters']:,} | {s['trainable']:,} | "
                f"{s['state_bytes'] / 2**20:,.1f} | {s['state_bytes'] / s['trainable']:.2f} |")
            print(state_lines[-1], flush=True)
    lines += ["", *summary, "", "AdamW's state after one step of the FSDP engine (one rank):", "",
              "| size | run | parameters | trainable | state MiB | state bytes per trainable value |",
              "|---|---|---:|---:|---:|---:|", *state_lines, ""]
    text = "\n".join(lines)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
