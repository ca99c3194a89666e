"""Synchronous against asynchronous (one step off, streaming) GRPO on this machine: throughput, each pool's idle
share, and learning against wall-clock time.

    python benchmarks/async_vs_sync.py [--sizes 10m,50m] [--steps 6] [--workdir runs/async]
    python benchmarks/async_vs_sync.py --device cuda --pools 4,4 --sizes 400m,1b   # 8 GPUs, Ray
    python benchmarks/async_vs_sync.py --learning [--seeds 0,1,2,3] [--dtype fp32] [--workdir runs/lora_learning]

Throughput (the default): for each tiny-model size and two workloads, four GRPO runs of `--steps` steps with the
quickstart's batch (16 prompts x 8 samples), each in a fresh process on the Ray backend, one CPU thread per worker
process: colocated sync (2 processes, each actor + rollout), split sync (1 training + 1 rollout process), one step
off (the same split, `async_training.mode=one_step_off`) and streaming (`async_training.mode=streaming`). The
quickstart workload: 64 response tokens from untrained weights (every response runs to the limit, so each step's
work is fixed); the long-tail one: up to 256 tokens from a model that ends responses at random
(`long_tail_model`), so a batch waits for its few longest rows. Reported as medians over the steps after the first:
samples/s, each pool's idle share of a step (the training pool: everything but its passes and the weight sync;
the rollout pool: everything but generation and receiving the weights) and the ratio to colocated sync. Writes
`benchmarks/results/async_vs_sync.md` (on GPUs, a file of its own: `_cuda` ends its name). `--pools T,R`
sizes the split layouts' training and rollout pools in devices (default 1,1: the two cores), colocated sync
taking T + R; on GPUs (`--device cuda`) that is where pools sized by the bottleneck pay. Each pool's size, and
their sum, must divide the 16 prompts of a step (the batch is split evenly over a pool's ranks).

Learning (`--learning`): the quickstart's recipe from each seed's SFT model (cached, shared with
benchmarks/placement_learning.py), colocated sync, then each of `--layouts` (one step off, streaming), one after
the other; held-out greedy accuracy after SFT and after the GRPO steps, the GRPO wall time, and the wall time each
took to reach the colocated run's final accuracy. Writes its table under benchmarks/results/, the dtype in the
file's name when `--dtype` is given (e.g. `benchmarks/results/async_vs_sync_learning_fp32.md`), and the layouts
when not all (`..._fp32_streaming.md`).
Run either on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

from hybridrl.quickstart import ACCURACY_KEY, PRECISION_KEYS

REPO = Path(__file__).resolve().parents[1]

RESULTS = REPO / "benchmarks" / "results"


def split_layout(training: int, rollout: int) -> list[str]:
    """The rollout on a pool of its own: `training` devices train, `rollout` generate."""
    return ["actor_rollout_ref.hybrid_engine=false", f"trainer.n_gpus_per_node={training}",
            f"rollout.n_gpus_per_node={rollout}"]


SPLIT = split_layout(1, 1)
ONE_STEP_OFF_MODE = ["async_training.mode=one_step_off"]
# a window's worth of prompts ahead (about one step off), rows in flight go on across a sync, and the continuous
# batch decodes the 128 rows the synchronous layouts decode at once
STREAMING_MODE = ["async_training.mode=streaming", "async_training.staleness_threshold=1",
                  "async_training.partial_rollout=true", "actor_rollout_ref.rollout.max_num_seqs=128"]
ONE_STEP_OFF, STREAMING = [*SPLIT, *ONE_STEP_OFF_MODE], [*SPLIT, *STREAMING_MODE]


def layouts(training: int, rollout: int) -> dict[str, list[str]]:
    """The four layouts of the throughput comparison: the split ones with pools of `training` and `rollout`
    devices, colocated sync with both on every device."""
    split = split_layout(training, rollout)
    return {"colocated sync": [f"trainer.n_gpus_per_node={training + rollout}"], "split sync": split,
            "one step off": [*split, *ONE_STEP_OFF_MODE], "streaming": [*split, *STREAMING_MODE]}


SAMPLES = 128  # 16 prompts x 8 samples
# the long-tail workload: responses up to LONG_TAIL_LENGTH tokens, their lengths spread by a model that ends a
# response with a small chance at every token (long_tail_model)
LONG_TAIL_LENGTH = 256
LONG_TAIL_EOS_PULL = 8.0


def idle_shares(history: list[dict], layout: str) -> dict[str, float]:
    """Samples/s and each pool's idle share of a step, medians over the steps after the first."""
    steady = history[1:]  # the first step pays one-time costs (allocations, the engine's first batch)

    def median(value) -> float:
        return statistics.median(value(m) for m in steady)

    def training(m: dict) -> float:
        passes = sum(m.get(f"timing_s/{stage}_worker", 0.0) for stage in ("old_log_prob", "ref", "update_actor"))
        return passes + m.get("timing_s/weight_sync", 0.0)

    def rollout(m: dict) -> float:
        if "timing_s/gen_worker" not in m:  # streaming: generation runs beside the step; its waits are measured
            return m["timing_s/step"] - m["timing_s/rollout_idle"]
        return m["timing_s/gen_worker"] + m.get("timing_s/weight_sync", 0.0)

    out = {"samples_per_s": median(lambda m: SAMPLES / m["timing_s/step"]),
           "tokens_per_s": median(lambda m: SAMPLES * m["response_length/mean"] / m["timing_s/step"]),
           "step": median(lambda m: m["timing_s/step"])}
    if layout == "colocated sync":  # the same processes run both phases one after the other
        out["training_idle"] = out["rollout_idle"] = median(
            lambda m: max(0.0, 1 - (training(m) + m["timing_s/gen_worker"]) / m["timing_s/step"]))
    else:
        out["training_idle"] = median(lambda m: max(0.0, 1 - training(m) / m["timing_s/step"]))
        out["rollout_idle"] = median(lambda m: max(0.0, 1 - rollout(m) / m["timing_s/step"]))
    out["trainer_wait"] = median(lambda m: m.get("timing_s/trainer_idle", 0.0))
    return out


def long_tail_model(model: Path, out: Path, eos_pull: float = LONG_TAIL_EOS_PULL) -> Path:
    """A copy of `model` in `out` with EOS pulled up (`hybridrl.models.tiny.pull_eos_up`): every token ends the
    response with a small chance, so lengths spread geometrically with a long tail (an untrained model otherwise
    never stops before the length limit)."""
    import shutil

    from hybridrl.models.tiny import pull_eos_up

    if (out / "config.json").exists():
        return out
    shutil.copytree(model, out)
    return pull_eos_up(out, eos_pull)


def _sibling_scripts() -> None:
    """Make the other benchmark scripts importable. Done on use, not at import: benchmarks/learning.py shares its
    module name with tests/trainer/learning.py, and the tests import this script's functions."""
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))


def throughput(args: argparse.Namespace, command: str) -> str:
    _sibling_scripts()
    import torch
    from learning import cpu_name
    from lora_memory import prepare
    from placement import grpo_run

    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    training, rollout = (int(n) for n in args.pools.split(","))
    on_gpu = args.device == "cuda"
    machine = (f"GPU: {training + rollout} x {torch.cuda.get_device_name()}, torch {torch.__version__}" if on_gpu
               else f"CPU: {cpu_name()}")
    per_process = "one GPU per worker process" if on_gpu else "one CPU thread per worker process"
    lines = [
        "# Synchronous against asynchronous GRPO: throughput",
        "",
        f"{machine}; command: `{command}`; nothing else ran on the machine. GRPO, {args.steps} steps of 16 "
        f"prompts x 8 samples, {'bf16' if on_gpu else 'fp32'} (the automatic precision), use_kl_loss=true, Ray "
        f"backend, {per_process}. Quickstart "
        "workload: 64 response tokens, untrained model (every response is 64 tokens). Long-tail workload: up to "
        f"{LONG_TAIL_LENGTH} response tokens from the untrained model with EOS pulled up (long_tail_model, "
        f"eos_pull={LONG_TAIL_EOS_PULL}): lengths spread geometrically, a few at the limit. Colocated: "
        f"{training + rollout} processes, each actor + rollout. Split, one step off and streaming: {training} "
        f"training + {rollout} rollout processes; streaming "
        f"with {' '.join(STREAMING_MODE)}. Medians over the steps after the first. Idle: the share of a "
        "step a pool spent outside its own work (its passes and the weight sync; streaming's rollout: the time its "
        "thread waited for budget or a sync); 'trainer waits' is timing_s/trainer_idle, the training pool waiting "
        "for samples.",
        "",
        "| workload | size | layout | samples/s | response tokens/s | x colocated sync | step s | training pool idle | "
        "rollout pool idle | trainer waits s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size in args.sizes.split(","):
        model, data = prepare(workdir, size)
        workloads = {"quickstart": (model, []),
                     "long-tail": (long_tail_model(model, workdir / f"model_{size}_long_tail"),
                                   [f"data.max_response_length={LONG_TAIL_LENGTH}"])}
        for workload, (workload_model, extra) in workloads.items():
            rows = {}
            for name, layout in layouts(training, rollout).items():
                run_name = f"{size}_{workload}_{name.replace(' ', '_')}"
                history = grpo_run(workdir, workload_model, data, run_name, [*layout, *extra], args.steps,
                                   args.device)
                rows[name] = r = idle_shares(history, name)
                ratio = r["samples_per_s"] / rows["colocated sync"]["samples_per_s"]
                lines.append(f"| {workload} | {size} | {name} | {r['samples_per_s']:.1f} | "
                             f"{r['tokens_per_s']:.0f} | {ratio:.2f} | {r['step']:.2f} | {r['training_idle']:.0%} | "
                             f"{r['rollout_idle']:.0%} | {r['trainer_wait']:.2f} |")
                print(lines[-1], flush=True)
    lines.append("")
    (RESULTS / f"async_vs_sync{'_cuda' if on_gpu else ''}.md").write_text("\n".join(lines))
    return "\n".join(lines)


def accuracy_over_time(run_dir: Path) -> list[tuple[float, float]]:
    """(seconds since the first step started, held-out accuracy) at each validation of a run."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if "timing_s/step" in r)
    start = first["training/time"] - first["timing_s/step"]
    return [(r["training/time"] - start, r[ACCURACY_KEY]) for r in rows if ACCURACY_KEY in r]


def time_to_reach(curve: list[tuple[float, float]], target: float) -> float | None:
    return next((seconds for seconds, accuracy in curve if accuracy >= target), None)


ASYNC_LEARNING = {"one_step_off": ONE_STEP_OFF, "streaming": STREAMING}


def learning(args: argparse.Namespace, command: str) -> str:
    _sibling_scripts()
    from learning import STEPS, cpu_name
    from lora_learning import variant_in_subprocess

    precision = ["actor_rollout_ref.rollout.calculate_log_probs=true",
                 *(f"{key}={args.dtype}" for key in PRECISION_KEYS if args.dtype)]
    tag = f"_{args.dtype}" if args.dtype else ""
    layouts = args.layouts.split(",")
    workdir = Path(args.workdir).resolve()
    lines = [
        "# Synchronous against asynchronous GRPO: learning (the quickstart's recipe)",
        "",
        f"CPU: {cpu_name()}; command: `{command}`; nothing else ran on the machine.",
        "Colocated sync: the quickstart's recipe (2 Ray workers, each actor + rollout). "
        + " ".join(f"{name}: {' '.join(ASYNC_LEARNING[name])}." for name in layouts)
        + f" Both with the default truncated token IS correction. Compute and rollout in "
        f"{args.dtype or 'the quickstart precision'}. Held-out greedy accuracy on the 500 test problems after SFT "
        f"and after {STEPS} GRPO steps (validated every 10 steps); 'GRPO s' is the GRPO phase's wall time; "
        "'reach s' is the time from the first step's start to the first validation at or above the colocated sync "
        "run's final accuracy (for the sync run: its time to its end).",
        "",
        "| seed | layout | after SFT | after GRPO | gain | GRPO s | x sync GRPO s | reach s | x sync reach |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    gains: dict[str, list[float]] = {name: [] for name in ("sync", *layouts)}
    for seed in (int(s) for s in args.seeds.split(",")):
        overrides = {"sync": precision, **{name: [*precision, *ASYNC_LEARNING[name]] for name in layouts}}
        variants = {"sync": f"placement_colocated{tag}", **{name: f"async_{name}{tag}" for name in layouts}}
        sync_target = sync_seconds = sync_reach = None
        for name, variant in variants.items():
            run = variant_in_subprocess(workdir, seed, variant, overrides[name])
            curve = accuracy_over_time(workdir / f"seed{seed}" / variant / "grpo")
            gains[name].append(run["curve"][-1][1] - run["curve"][0][1])
            if name == "sync":
                sync_target, sync_seconds, sync_reach = run["curve"][-1][1], run["grpo_seconds"], curve[-1][0]
            reach = curve[-1][0] if name == "sync" else time_to_reach(curve, sync_target)
            lines.append(
                f"| {seed} | {name} | {run['curve'][0][1]:.3f} | {run['curve'][-1][1]:.3f} | {gains[name][-1]:+.3f} | "
                f"{run['grpo_seconds']:.0f} | {run['grpo_seconds'] / sync_seconds:.2f} | "
                f"{'not reached' if reach is None else f'{reach:.0f}'} | "
                f"{'' if reach is None else f'{reach / sync_reach:.2f}'} |")
            print(lines[-1], flush=True)
    lines += ["", *(f"{name} gain: min {min(g):+.3f}, max {max(g):+.3f}, mean {statistics.mean(g):+.3f}."
                    for name, g in gains.items()), ""]
    suffix = "" if layouts == list(ASYNC_LEARNING) else "_" + "_".join(layouts)
    (RESULTS / f"async_vs_sync_learning{tag}{suffix}.md").write_text("\n".join(lines))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10m,50m")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--learning", action="store_true", help="the learning comparison instead of throughput")
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--layouts", default=",".join(ASYNC_LEARNING),
                        help="the asynchronous layouts the learning comparison runs beside colocated sync")
    parser.add_argument("--dtype", help="compute and rollout dtype of the learning runs (default: the quickstart's)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="trainer.device of the throughput runs")
    parser.add_argument("--pools", default="1,1",
                        help="devices of the split layouts' training and rollout pools (colocated sync: their sum)")
    parser.add_argument("--workdir", default=None, help="runs/async (throughput) or runs/lora_learning (learning)")
    args = parser.parse_args()
    args.workdir = args.workdir or ("runs/lora_learning" if args.learning else "runs/async")
    command = shlex.join(["python", "benchmarks/async_vs_sync.py", *sys.argv[1:]])
    RESULTS.mkdir(parents=True, exist_ok=True)
    print(learning(args, command) if args.learning else throughput(args, command))


if __name__ == "__main__":
    main()
