"""Colocated against split placement on this machine: throughput, each pool's busy share, and the weight sync.

    python benchmarks/placement.py [--sizes 10m,50m] [--steps 6] [--workdir runs/placement]

For each tiny-model size (hybridrl/models/tiny.py; untrained weights: every response runs to the length
limit, so the work per step is fixed) two GRPO runs of `--steps` steps with the quickstart's batch
(16 prompts x 8 samples, 64 response tokens), each in a fresh process on the Ray backend, one CPU thread per
worker process:
- colocated: 2 processes, each holding actor + rollout (the hybrid engine);
- split: `actor_rollout_ref.hybrid_engine=false`, 1 training process + 1 rollout process, the rollout's
  weights synced after every update.
Reported, as medians over the steps after the first (of each step's value): samples/s, step time, each pool's busy share of
the step (the training pool: old log-prob, reference and update passes plus sending the weights; the
rollout pool: generation plus receiving them; colocated, both are the same processes), and the weight
sync's time, bytes, GB/s and share of the step, against this machine's memcpy bandwidth measured in the same
run (a copy between two 256 MiB buffers). Writes `benchmarks/results/placement.md`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from learning import cpu_name  # noqa: E402
from lora_memory import prepare  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
LAYOUTS = {
    "colocated": ["trainer.n_gpus_per_node=2"],
    "split": ["actor_rollout_ref.hybrid_engine=false", "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1"],
}


def memcpy_gbps(megabytes: int = 256, repeats: int = 7) -> float:
    """Bytes copied per second between two buffers in this process, single-threaded (the median of `repeats`)."""
    import torch

    torch.set_num_threads(1)
    src = torch.ones(megabytes * 2**20 // 4)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return src.numel() * 4 / statistics.median(times) / 1e9


def grpo_run(workdir: Path, model: Path, data: Path, name: str, layout: list[str], steps: int,
             device: str = "cpu") -> list[dict]:
    run = workdir / name
    subprocess.run([
        sys.executable, "-m", "hybridrl.trainer.main_ppo", "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=8",
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.rollout.calculate_log_probs=true", f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.save_freq=-1", "trainer.logger=[file]",
        "trainer.resume_mode=disable", f"trainer.default_local_dir={run}", f"trainer.device={device}", *layout,
    ], check=True, capture_output=True, cwd=REPO)
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def summarise(history: list[dict], split: bool) -> dict:
    steady = history[1:]  # the first step pays one-time costs (allocations, the engine's first batch)

    def per_step(value) -> float:
        return statistics.median(value(m) for m in steady)

    def training(m: dict) -> float:
        return sum(m.get(f"timing_s/{stage}_worker", 0.0) for stage in ("old_log_prob", "ref", "update_actor"))

    def sync(m: dict) -> float:
        return m.get("timing_s/weight_sync", 0.0)

    out = {
        "step": per_step(lambda m: m["timing_s/step"]),
        "samples_per_s": per_step(lambda m: 128 / m["timing_s/step"]),
        "sync": per_step(sync), "sync_share": per_step(lambda m: sync(m) / m["timing_s/step"]),
        "sync_gb": per_step(lambda m: m.get("perf/weight_sync_bytes", 0.0)) / 1e9,
        "sync_gbps": per_step(lambda m: m.get("perf/weight_sync_gbps", 0.0)),
        "log_prob_diff_max": max(m["rollout/log_prob_diff_max"] for m in history),
    }
    if split:  # each pool's own work, and the sync, which occupies both
        out["training_busy"] = per_step(lambda m: (training(m) + sync(m)) / m["timing_s/step"])
        out["rollout_busy"] = per_step(lambda m: (m["timing_s/gen_worker"] + sync(m)) / m["timing_s/step"])
    else:  # the same processes run both phases one after the other
        out["training_busy"] = out["rollout_busy"] = per_step(
            lambda m: (training(m) + m["timing_s/gen_worker"]) / m["timing_s/step"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10m,50m")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--workdir", default="runs/placement")
    args = parser.parse_args()
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "benchmarks/placement.py", *sys.argv[1:]])
    bandwidth = memcpy_gbps()
    lines = [
        "# Placement: colocated against split",
        "",
        f"CPU: {cpu_name()}; command: `{command}`; nothing else ran on the machine. GRPO, {args.steps} steps of 16 "
        "prompts x 8 samples x 64 response tokens (untrained model: every response is 64 tokens), fp32, "
        "use_kl_loss=true, Ray backend, one CPU thread per worker process. Colocated: 2 processes, each actor + "
        "rollout. Split: 1 training process + 1 rollout process. Medians over the steps after the first.",
        f"This machine's memcpy bandwidth, one thread, measured in the same run: {bandwidth:.2f} GB/s.",
        "",
        "| size | layout | samples/s | step s | training pool busy | rollout pool busy | weight sync s | sync GB | "
        "sync GB/s | sync / memcpy | sync share of step | log_prob_diff_max |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios = []
    for size in args.sizes.split(","):
        model, data = prepare(workdir, size)
        rows = {}
        for name, layout in LAYOUTS.items():
            rows[name] = r = summarise(grpo_run(workdir, model, data, f"{size}_{name}", layout, args.steps),
                                       split=name == "split")
            sync = (f"{r['sync']:.3f} | {r['sync_gb']:.3f} | {r['sync_gbps']:.2f} | {r['sync_gbps'] / bandwidth:.2f} | "
                    f"{r['sync_share']:.1%}") if name == "split" else "- | - | - | - | -"
            lines.append(f"| {size} | {name} | {r['samples_per_s']:.1f} | {r['step']:.2f} | {r['training_busy']:.0%} | "
                         f"{r['rollout_busy']:.0%} | {sync} | {r['log_prob_diff_max']:.1e} |")
            print(lines[-1], flush=True)
        ratios.append(f"- {size}: split / colocated samples/s {rows['split']['samples_per_s'] / rows['colocated']['samples_per_s']:.2f}; "
                      f"weight sync {rows['split']['sync_share']:.1%} of a split step.")
    lines += ["", *ratios, ""]
    text = "\n".join(lines)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "placement.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
