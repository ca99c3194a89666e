"""Does GRPO with LoRA learn the quickstart's task, and what does it cost next to the full fine-tune?

    python benchmarks/lora_learning.py [--seeds 0,1,2,3] [--rank 8] [--alpha 16] [--lr 1e-3]
                                       [--workdir runs/lora_learning] [--name lora_learning]

For each seed the quickstart's data, tiny model and SFT warm start are made once (its own functions, cached
under `--workdir/seedS/`), then its GRPO recipe runs twice from that SFT model, one after the other in fresh
processes: the full fine-tune (the recipe as it is) and LoRA (`actor_rollout_ref.model.lora_rank`,
`lora_alpha`, `actor_rollout_ref.actor.optim.lr` added). Both run exactly as `python -m hybridrl.quickstart`
runs GRPO (2 Ray workers, one thread each, bf16 compute where the CPU has it natively).

Reported per seed: held-out greedy accuracy after SFT and after 30 GRPO steps, the gain, the GRPO phase's
wall time (Ray start, steps, the held-out evaluations, the checkpoint) and the median step, and LoRA / full
ratios. Run it on an otherwise idle machine: the times are compared side by side.
Writes `benchmarks/results/<name>.md`; the last lines printed are `min LoRA gain` and `max time ratio`.
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
from learning import ACCURACY_KEY, STEPS, cpu_name  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"


def run_variant(seed_dir: Path, seed: int, variant: str, overrides: list[str]) -> dict:
    """One GRPO run (in this process: the caller starts a fresh one per run) from the seed's SFT model."""
    from hybridrl import quickstart

    data = quickstart.prepare_data(seed_dir, seed)
    model = quickstart.warm_start(seed_dir, data, quickstart.prepare_base_model(seed_dir, seed), seed)
    workdir = seed_dir / variant
    workdir.mkdir(exist_ok=True)
    start = time.perf_counter()
    with quickstart.torch_threads(None):
        history = quickstart.train_grpo(workdir, data, model, STEPS, quickstart.grpo_run_overrides(None, overrides),
                                        seed)
    seconds = time.perf_counter() - start
    steps = [m["timing_s/step"] for m in history if "timing_s/step" in m]
    return {"curve": [[m["training/global_step"], m[ACCURACY_KEY]] for m in history if ACCURACY_KEY in m],
            "grpo_seconds": seconds, "median_step_s": statistics.median(steps),
            "peak_rss_gb": max(m.get("perf/max_memory_rss_gb/workers_sum", 0.0) for m in history)}


def variant_in_subprocess(workdir: Path, seed: int, variant: str, overrides: list[str]) -> dict:
    """A run's result; a finished run (its json written) is reused."""
    seed_dir = workdir / f"seed{seed}"
    seed_dir.mkdir(parents=True, exist_ok=True)
    out = seed_dir / f"{variant}.json"
    if out.exists():
        return json.loads(out.read_text())
    with (seed_dir / f"{variant}.log").open("w") as log:
        subprocess.run([sys.executable, __file__, "--one", str(seed_dir), "--seeds", str(seed), "--variant", variant,
                        *(f"--override={o}" for o in overrides)], check=True, stdout=log, stderr=subprocess.STDOUT,
                       cwd=REPO)
    return json.loads(out.read_text())


def merged_accuracy(seed_dir: Path) -> float:
    """The LoRA run's last checkpoint through the merger, as a plain model in transformers (fp32, greedy
    `generate`), scored on the held-out problems: the trained policy without hybridrl or PEFT."""
    from grpo_vs_trl import greedy_accuracy
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridrl.model_merger import merge_checkpoint

    actor = seed_dir / "lora" / "grpo" / f"global_step_{STEPS}" / "actor"
    target = merge_checkpoint(actor, seed_dir / "lora" / "merged")
    tokenizer = AutoTokenizer.from_pretrained(target, padding_side="left")
    workload = argparse.Namespace(data=str(seed_dir / "data"), response_length=64)
    return greedy_accuracy(AutoModelForCausalLM.from_pretrained(target), tokenizer, workload)


def report(rows: list[tuple[int, dict, dict]], lora_keys: list[str], command: str) -> str:
    lines = [
        "# GRPO with LoRA against the full fine-tune (the quickstart's recipe)",
        "",
        f"CPU: {cpu_name()}; command: `{command}`; nothing else ran on the machine.",
        f"LoRA: {' '.join(lora_keys)} (everything else the quickstart's recipe). Held-out greedy accuracy on "
        f"the 500 test problems after SFT and after {STEPS} GRPO steps; 'GRPO s' is the GRPO phase's wall time "
        "(Ray start, steps, evaluations every 10 steps, the final checkpoint), the two runs of a seed one after "
        "the other from the same SFT model; 'RSS' is the two workers' summed peak resident memory. The last column "
        "scores the LoRA run's final checkpoint after `python -m hybridrl.model_merger`, loaded as a plain model "
        "in transformers (fp32, greedy `generate`), on the same problems.",
        "",
        "| seed | after SFT | full after | full gain | LoRA after | LoRA gain | full GRPO s | LoRA GRPO s | "
        "time ratio | full step s | LoRA step s | step ratio | full RSS GB | LoRA RSS GB | LoRA merged, transformers |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for seed, full, lora in rows:
        before = full["curve"][0][1]
        lines.append(
            f"| {seed} | {before:.3f} | {full['curve'][-1][1]:.3f} | {full['curve'][-1][1] - before:+.3f} | "
            f"{lora['curve'][-1][1]:.3f} | {lora['curve'][-1][1] - lora['curve'][0][1]:+.3f} | "
            f"{full['grpo_seconds']:.0f} | {lora['grpo_seconds']:.0f} | "
            f"{lora['grpo_seconds'] / full['grpo_seconds']:.2f} | {full['median_step_s']:.2f} | "
            f"{lora['median_step_s']:.2f} | {lora['median_step_s'] / full['median_step_s']:.2f} | "
            f"{full['peak_rss_gb']:.2f} | {lora['peak_rss_gb']:.2f} | {lora['merged_accuracy']:.3f} |")
    gains = [lora["curve"][-1][1] - lora["curve"][0][1] for _, _, lora in rows]
    full_gains = [full["curve"][-1][1] - full["curve"][0][1] for _, full, _ in rows]
    ratios = [lora["grpo_seconds"] / full["grpo_seconds"] for _, full, lora in rows]
    lines += ["", f"LoRA gain: min {min(gains):+.3f}, mean {statistics.mean(gains):+.3f}; full fine-tune gain: "
                  f"min {min(full_gains):+.3f}, mean {statistics.mean(full_gains):+.3f}; GRPO time ratio "
                  f"LoRA / full: median {statistics.median(ratios):.2f}, max {max(ratios):.2f}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=16)
    parser.add_argument("--lr", default="1e-3")
    parser.add_argument("--workdir", default="runs/lora_learning")
    parser.add_argument("--name", default="lora_learning")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: one run, in its own process
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--override", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        seed_dir = Path(args.one)
        result = run_variant(seed_dir, int(args.seeds), args.variant, args.override)
        (seed_dir / f"{args.variant}.json").write_text(json.dumps(result))
        return
    lora_keys = [f"actor_rollout_ref.model.lora_rank={args.rank}", f"actor_rollout_ref.model.lora_alpha={args.alpha:g}",
                 f"actor_rollout_ref.actor.optim.lr={args.lr}"]
    workdir = Path(args.workdir).resolve()
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        full = variant_in_subprocess(workdir, seed, "full", [])
        lora = variant_in_subprocess(workdir, seed, "lora", lora_keys)
        print(f"seed {seed}: full {full['curve'][0][1]:.3f} -> {full['curve'][-1][1]:.3f} in {full['grpo_seconds']:.0f}s,"
              f" LoRA -> {lora['curve'][-1][1]:.3f} in {lora['grpo_seconds']:.0f}s", flush=True)
        lora["merged_accuracy"] = merged_accuracy(workdir / f"seed{seed}")
        rows.append((seed, full, lora))
    text = report(rows, lora_keys, shlex.join(["python", "benchmarks/lora_learning.py", *sys.argv[1:]]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.md").write_text(text)
    print(text)
    print(f"min LoRA gain: {min(r[2]['curve'][-1][1] - r[2]['curve'][0][1] for r in rows) * 100:.1f}")
    print(f"max time ratio: {max(r[2]['grpo_seconds'] / r[1]['grpo_seconds'] for r in rows):.2f}")


if __name__ == "__main__":
    main()
