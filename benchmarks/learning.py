"""Does the main job learn on any machine? The quickstart's recipe over seeds x torch thread counts, with
TRL's GRPOTrainer from the same SFT model beside it.

    python benchmarks/learning.py [--seeds 0,1,2,3] [--threads 1,2] [--jobs 1] [--no-trl]
                                  [--override KEY=VALUE ...] [--name learning]

Machines of the project's kind differ in CPU (Intel with AMX, AMD with AVX512_BF16), and their kernels sum
floating-point numbers in another order, so one run's figure says little: the same recipe once gave 0.52
held-out accuracy after SFT on one CPU and 0.24 on another. Seeds (task data, model init, SFT data order)
and thread counts (1 or 2 per process: SFT's, and each GRPO worker's) stand in for other hardware.

Each run is `python -m hybridrl.quickstart --seed S --threads T` in a subprocess, in its own directory
under `--workdir` (a finished run is reused). Then, unless `--no-trl`, TRL's GRPOTrainer trains the same
SFT model on the same prompts and reward with the same samples per step, in the venv of
`benchmarks/requirements-trl.txt` (see benchmarks/grpo_vs_trl.py): 16 prompts x 8 samples per generation,
two optimizer steps of 64 samples each (hybridrl's ppo_mini_batch_size=8 prompts), lr 5e-5 constant,
AdamW wd 0.01, clip 1.0, no KL, token-mean loss, temperature 1, 64 tokens; held-out greedy accuracy on
the same 500 problems every 10 generation steps.

`--override KEY=VALUE` (repeatable) adds a Hydra override to every quickstart's GRPO run, e.g. the bf16
settings `actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bfloat16` and
`actor_rollout_ref.rollout.dtype=bfloat16`; give such a run its own `--workdir` and `--name`.

Writes `benchmarks/results/<name>.md` and `<name>.png` (default name `learning`): for every run the SFT accuracy, the accuracy
after GRPO and the gain, their min and mean, and TRL's, with the samples each needed to gain 10 points.
The last line printed is `min gain: <points>`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
TRL_PYTHON = REPO / "benchmarks" / ".venv-trl" / "bin" / "python"
ACCURACY_KEY = "val-core/arithmetic/reward/mean@1"
TARGET_GAIN = 0.10
STEPS = 30
PROMPTS, SAMPLES_PER_PROMPT = 16, 8  # the quickstart's data.train_batch_size and rollout.n
SAMPLES_PER_STEP = PROMPTS * SAMPLES_PER_PROMPT
EVAL_EVERY = 10  # generation steps between held-out evaluations, as the quickstart's trainer.test_freq


def run_dir(workdir: Path, seed: int, threads: int) -> Path:
    return workdir / f"seed{seed}_threads{threads}"


def thread_env(threads: int) -> dict[str, str]:
    """The environment of a run: every process it starts computes with `threads` threads."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


# ----- hybridrl: the quickstart itself ------------------------------------------------------------------
def run_hybridrl(workdir: Path, seed: int, threads: int, overrides: tuple[str, ...] = ()) -> dict:
    out = run_dir(workdir, seed, threads)
    result_file = out / "hybridrl.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with (out / "quickstart.log").open("w") as log:
        subprocess.run([sys.executable, "-m", "hybridrl.quickstart", "--workdir", str(out), "--seed", str(seed),
                        "--threads", str(threads), f"--steps={STEPS}", *overrides],
                       check=True, env=thread_env(threads), stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    history = [json.loads(line) for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    result = {
        "curve": [[m["training/global_step"], m[ACCURACY_KEY]] for m in history if ACCURACY_KEY in m],
        "minutes": (time.perf_counter() - start) / 60,
    }
    result_file.write_text(json.dumps(result))
    return result


# ----- TRL from the same SFT model (runs inside the TRL venv) -------------------------------------------
def run_trl(out: Path, threads: int) -> dict:
    """TRL's GRPOTrainer on the run's SFT model and data, evaluated like the quickstart's trainer."""
    import torch
    from transformers import TrainerCallback

    sys.path.insert(0, str(Path(__file__).parent))
    from grpo_vs_trl import Workload, greedy_accuracy, trl_trainer

    torch.set_num_threads(threads)
    sft_model = next((out / "sft").glob("global_step_*/actor/huggingface"))
    micro = 32
    updates_per_generation = 2  # hybridrl's two mini-batches of 8 prompts per 16-prompt step
    w = Workload(size="1m", model=str(sft_model), start="sft", data=str(out / "data"), prompts=PROMPTS,
                 n=SAMPLES_PER_PROMPT, response_length=64, steps=STEPS * updates_per_generation, warmup=0,
                 evaluate=True, micro_batch=micro)
    curve: list[list[float]] = []

    class HeldOut(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
            if state.global_step % (EVAL_EVERY * updates_per_generation) == 0:
                curve.append([state.global_step // updates_per_generation,
                              greedy_accuracy(model, processing_class, w)])

    accumulate = SAMPLES_PER_STEP // updates_per_generation // micro
    trainer = trl_trainer(w, out / "trl", callbacks=[HeldOut()], gradient_accumulation_steps=accumulate,
                          steps_per_generation=accumulate * updates_per_generation)
    curve.append([0, greedy_accuracy(trainer.model, trainer.processing_class, w)])
    start = time.perf_counter()
    trainer.train()
    return {"curve": sorted(curve), "minutes": (time.perf_counter() - start) / 60}


def run_trl_in_venv(workdir: Path, seed: int, threads: int, trl_python: Path) -> dict | None:
    out = run_dir(workdir, seed, threads)
    result_file = out / "trl.json"
    if not result_file.exists():
        with (out / "trl.log").open("w") as log:
            subprocess.run([str(trl_python), __file__, "--trl-run", str(out), "--threads", str(threads)],
                           check=True, env=thread_env(threads), stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    return json.loads(result_file.read_text())


# ----- the report ---------------------------------------------------------------------------------------
def samples_to_gain(curve: list[list[float]], gain: float = TARGET_GAIN) -> int | None:
    """Samples generated before the first evaluation at least `gain` above the start (None: never)."""
    start = curve[0][1]
    return next((int(step) * SAMPLES_PER_STEP for step, acc in curve if acc >= start + gain - 1e-9), None)


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            isa = [f for f in ("amx_bf16", "avx512_bf16", "avx512f") if f" {f}" in cpuinfo]
            return f"{line.split(':', 1)[1].strip()} ({', '.join(isa) or 'no AVX-512'}), {os.cpu_count()} cores"
    return platform.processor() or "unknown CPU"


def report(runs: list[tuple[int, int, dict, dict | None]], command: str = "python benchmarks/learning.py") -> str:
    def fmt(x: float | None) -> str:
        return "never" if x is None else f"{x:,}"

    lines = [
        "# Learning over seeds and thread counts",
        "",
        f"CPU: {cpu_name()}; torch threads per process as given; command: `{command}`.",
        f"Held-out greedy accuracy on the 500 test problems; GRPO {STEPS} steps of {PROMPTS} prompts x "
        f"{SAMPLES_PER_PROMPT} samples. 'samples to +{TARGET_GAIN * 100:.0f}' counts generated samples up to "
        f"the first evaluation (every {EVAL_EVERY} steps) at least {TARGET_GAIN * 100:.0f} points above the start.",
        "'minutes' is each quickstart run's wall time (data, SFT, GRPO; no pip install) with whatever else",
        "ran on the machine at the time (`--jobs`, other work): a record, not a timing benchmark.",
        "",
        "| seed | threads | after SFT | after GRPO | gain | samples to +10 | minutes (quickstart) "
        "| TRL after | TRL gain | TRL samples to +10 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    gains, trl_gains = [], []
    for seed, threads, ours, trl in runs:
        before, after = ours["curve"][0][1], ours["curve"][-1][1]
        gains.append(after - before)
        trl_cells = ["-", "-", "-"]
        if trl is not None:
            trl_gain = trl["curve"][-1][1] - trl["curve"][0][1]
            trl_gains.append(trl_gain)
            trl_cells = [f"{trl['curve'][-1][1]:.3f}", f"{trl_gain:+.3f}", fmt(samples_to_gain(trl["curve"]))]
        lines.append(f"| {seed} | {threads} | {before:.3f} | {after:.3f} | {after - before:+.3f} | "
                     f"{fmt(samples_to_gain(ours['curve']))} | {ours['minutes']:.1f} | " + " | ".join(trl_cells) + " |")
    lines += ["", f"hybridrl gain: min {min(gains):+.3f}, mean {statistics.mean(gains):+.3f} over {len(gains)} runs."]
    if trl_gains:
        lines.append(f"TRL gain: min {min(trl_gains):+.3f}, mean {statistics.mean(trl_gains):+.3f} over "
                     f"{len(trl_gains)} runs.")
    return "\n".join(lines) + "\n"


def plot(runs: list[tuple[int, int, dict, dict | None]], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    markers = {1: "o", 2: "x"}
    for seed, threads, ours, trl in runs:
        color = f"C{seed % 10}"
        ax.plot(*zip(*ours["curve"], strict=True), marker=markers.get(threads, "s"), color=color,
                label=f"seed {seed}, {threads} thr")
        if trl is not None:
            ax.plot(*zip(*trl["curve"], strict=True), linestyle="--", color=color, alpha=0.5)
    ax.set_xlabel("GRPO step (dashed: TRL from the same SFT model; equal curves overlap)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title("quickstart recipe over seeds and thread counts")
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--threads", default="1,2", help="torch threads per process, comma-separated")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (their threads share the cores)")
    parser.add_argument("--workdir", default="runs/learning")
    parser.add_argument("--no-trl", action="store_true", help="leave TRL out")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="Hydra override for every quickstart's GRPO run (repeatable)")
    parser.add_argument("--name", default="learning", help="results file stem under benchmarks/results/")
    parser.add_argument("--trl-python", default=str(TRL_PYTHON), help="python of the TRL venv")
    parser.add_argument("--trl-run", help=argparse.SUPPRESS)  # internal: one TRL run, inside the TRL venv
    args = parser.parse_args()
    if args.trl_run:
        out = Path(args.trl_run)
        (out / "trl.json").write_text(json.dumps(run_trl(out, int(args.threads))))
        return
    workdir = Path(args.workdir).resolve()
    plan = [(int(s), int(t)) for t in args.threads.split(",") for s in args.seeds.split(",")]
    with_trl = not args.no_trl
    if with_trl and not Path(args.trl_python).exists():
        sys.exit(f"{args.trl_python} not found: create the TRL venv (benchmarks/requirements-trl.txt) or pass --no-trl")

    def one(seed_threads: tuple[int, int]) -> tuple[int, int, dict, dict | None]:
        seed, threads = seed_threads
        ours = run_hybridrl(workdir, seed, threads, tuple(args.override))
        trl = run_trl_in_venv(workdir, seed, threads, Path(args.trl_python)) if with_trl else None
        print(f"seed {seed} threads {threads}: {ours['curve'][0][1]:.3f} -> {ours['curve'][-1][1]:.3f}"
              + (f" (TRL {trl['curve'][-1][1]:.3f})" if trl else ""), flush=True)
        return seed, threads, ours, trl

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(one, plan))
    text = report(runs, shlex.join(["python", "benchmarks/learning.py", *sys.argv[1:]]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.md").write_text(text)
    plot(runs, RESULTS / f"{args.name}.png")
    print(text)
    print(f"min gain: {min(r[2]['curve'][-1][1] - r[2]['curve'][0][1] for r in runs) * 100:.1f}")


if __name__ == "__main__":
    main()
