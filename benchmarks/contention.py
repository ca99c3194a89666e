"""Step times alone and beside busy neighbours: SFT, GRPO on the local and the Ray backend, and GRPO's generation.

    .venv/bin/python benchmarks/contention.py                # everything, ~30 minutes on 2 cores
    .venv/bin/python benchmarks/contention.py --only sft     # one workload

Each run is the project's own entry point (`main_sft`, `main_ppo`) in a fresh process, started beside its
neighbours (each in its own session, as a second job would be) and measured from its metrics log: the median
`timing_s/step` after the warm-up steps, and for GRPO the median `timing_s/gen`. Neighbours: a
single-threaded Python loop, two of them, or a 2-thread torch matmul loop. Thread policies
(hybridrl/utils/cpu_threads.py): `adaptive`, the default; `fixed`, the given count whatever runs beside;
`fixed + passive wait`, the same with OpenMP threads that sleep at once instead of spinning
(`OMP_WAIT_POLICY=PASSIVE`). The runs alone are repeated, alternating the policies, because the
acceptance compares them within a few percent. Writes benchmarks/results/contention.md.

Run it on an otherwise idle machine: the only load must be the neighbours it starts.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_vs_trl as bench  # noqa: E402  (a sibling script, not a package)

from hybridrl.quickstart import SFT_OVERRIDES  # noqa: E402
from hybridrl.utils.cpu_threads import POLICY_ENV, SAMPLE_INTERVAL_S  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PY_LOOP = "while True: pass"
TORCH_LOOP = "import torch\ntorch.set_num_threads(2)\na = torch.randn(384, 384)\nwhile True: a @ a"
NEIGHBOURS = {"alone": [], "1 Python loop": [PY_LOOP], "2 Python loops": [PY_LOOP, PY_LOOP],
              "torch 2-thread matmul": [TORCH_LOOP]}
POLICIES = {"adaptive": {}, "fixed": {POLICY_ENV: "fixed"},
            "fixed + passive wait": {POLICY_ENV: "fixed", "OMP_WAIT_POLICY": "PASSIVE"}}


@dataclass
class Workload:
    name: str
    module: str
    overrides: list[str]
    steps: int
    warmup: int
    # (policy, neighbours) pairs beyond adaptive beside every neighbour kind
    extra: list[tuple[str, str]] = field(default_factory=list)


def workloads(data: Path, model: Path, steps: int) -> list[Workload]:
    ppo = [f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
           f"actor_rollout_ref.model.path={model}", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=8",
           "trainer.logger=[file]",
           "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1"]
    spinning = [("fixed", "1 Python loop"), ("fixed + passive wait", "alone"), ("fixed + passive wait", "1 Python loop")]
    return [
        Workload("SFT", "hybridrl.trainer.main_sft",
                 [*SFT_OVERRIDES, f"data.train_files={data / 'train.parquet'}", f"model.partial_pretrain={model}",
                  "trainer.backend=local", "trainer.n_gpus_per_node=1", "trainer.logger=[file]"],
                 steps=3 * steps, warmup=5, extra=spinning),
        # a fixed-count GRPO beside a neighbour takes about a minute a step: 3 steps of it
        Workload("GRPO local", "hybridrl.trainer.main_ppo",
                 [*ppo, "trainer.backend=local", "trainer.n_gpus_per_node=1"], steps=steps, warmup=2, extra=spinning),
        # the quickstart's layout: two 1-thread ranks, so the policies have no thread to take away
        Workload("GRPO Ray, 2 ranks x 1 thread", "hybridrl.trainer.main_ppo",
                 [*ppo, "trainer.backend=ray", "trainer.n_gpus_per_node=2"], steps=steps, warmup=2),
        Workload("GRPO Ray, 1 rank x 2 threads", "hybridrl.trainer.main_ppo",
                 [*ppo, "trainer.backend=ray", "trainer.n_gpus_per_node=1", "ray_init.cpus_per_worker=2"],
                 steps=steps, warmup=2),
    ]


def prepare(workdir: Path) -> tuple[Path, Path]:
    """The quickstart's task data and untrained 1M model (a GRPO step then generates every response in full)."""
    from hybridrl import quickstart

    return quickstart.prepare_data(workdir), quickstart.prepare_base_model(workdir)


def run_once(work: Workload, policy: str, neighbours: str, run_dir: Path, steps: int) -> dict:
    """One measured run beside its neighbours; the median step (and generation) seconds after the warm-up."""
    env = {**os.environ, **POLICIES[policy]}
    for key in (POLICY_ENV, "OMP_WAIT_POLICY"):
        if key not in POLICIES[policy]:
            env.pop(key, None)
    started = [subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.DEVNULL)
               for code in NEIGHBOURS[neighbours]]
    try:
        time.sleep(1.0)  # the neighbours are running before the run starts
        command = [sys.executable, "-m", work.module, *work.overrides, f"trainer.total_training_steps={steps}",
                   f"trainer.default_local_dir={run_dir}"]
        log = run_dir.with_suffix(".log")
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as out:
            done = subprocess.run(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        if done.returncode:
            raise RuntimeError(f"{shlex.join(command)} failed; its output: {log}")
    finally:
        for process in started:
            process.kill()
            process.wait()
    rows = [json.loads(line) for path in glob.glob(str(run_dir / "**" / "metrics.jsonl"), recursive=True)
            for line in Path(path).read_text().splitlines()]
    kept = [row for row in rows if "timing_s/step" in row][work.warmup:]
    gen = [row["timing_s/gen"] for row in kept if "timing_s/gen" in row]
    threads_changed = "torch threads" in log.read_text()
    return {"step": statistics.median(row["timing_s/step"] for row in kept),
            "gen": statistics.median(gen) if gen else None, "steps": len(kept), "refitted": threads_changed}


def plan(work: Workload, repeats: int) -> list[tuple[str, str]]:
    """Alone, the policies alternate `repeats` times (only adaptive where the workload compares none); then
    adaptive beside each kind of neighbour, then the workload's other contended pairs."""
    policies = ["adaptive", *dict.fromkeys(p for p, n in work.extra if n == "alone")]
    if work.extra:
        policies.insert(1, "fixed")
    alone = [(policy, "alone") for _ in range(repeats if work.extra else 1) for policy in policies]
    contended = [("adaptive", name) for name in NEIGHBOURS if name != "alone"]
    return alone + contended + [pair for pair in work.extra if pair[1] != "alone"]


def fit_cost(calls: int = 200_000, samples: int = 2_000) -> dict[str, float]:
    """What the adaptive policy adds where nothing runs beside: seconds per call between samples (a clock
    read) and per sample (/proc/stat and this process's CPU time), measured in this process."""
    import torch

    from hybridrl.utils import cpu_threads

    fit = cpu_threads.CpuThreadFit()
    fit.next_sample = time.monotonic() + 3600.0  # every call below falls between samples
    start = time.perf_counter()
    for _ in range(calls):
        fit.fit()
    gated = (time.perf_counter() - start) / calls
    # a sample's work without its decision (back-to-back samples span less than a tick of /proc/stat)
    start = time.perf_counter()
    for _ in range(samples):
        torch.get_num_threads()
        cpu_threads.read_cpu_times(fit.cpus)
    sampled = (time.perf_counter() - start) / samples
    return {"call_s": gated, "sample_s": sampled}


def report(results: dict[str, list[tuple[str, str, dict]]], command: str, cost: dict[str, float] | None = None) -> str:
    lines = [
        "# Step times beside busy neighbours", "",
        f"CPU: {bench.machine()}; measured {time.strftime('%Y-%m-%d')}; command: `{command}`.",
        "Nothing else ran beside the runs but the neighbours each started. Medians over the steps after the "
        "warm-up; where a row was run more than once, the median of the runs and their range. `x alone`: "
        "the median step against the same workload's adaptive median alone.", "",
    ]
    if cost:
        lines += [f"The adaptive policy's own cost, alone: {cost['call_s'] * 1e9:.0f} ns a call between samples "
                  f"(each worker call, decode step and micro-batch makes one) and {cost['sample_s'] * 1e6:.0f} us "
                  f"a sample (at most one each {SAMPLE_INTERVAL_S} s); alone it never changes the thread count.", ""]
    for work, runs in results.items():
        lines += [f"## {work}", "", "| policy | neighbours | step (s) | x alone | generation (s) | runs | threads refitted |",
                  "|---|---|---:|---:|---:|---:|---|"]
        base = statistics.median(r["step"] for p, n, r in runs if (p, n) == ("adaptive", "alone"))
        seen: list[tuple[str, str]] = []
        for policy, neighbours, _ in runs:
            if (policy, neighbours) not in seen:
                seen.append((policy, neighbours))
        for policy, neighbours in seen:
            same = [r for p, n, r in runs if (p, n) == (policy, neighbours)]
            steps = [r["step"] for r in same]
            spread = f" ({min(steps):.3f}-{max(steps):.3f})" if len(steps) > 1 else ""
            gens = [r["gen"] for r in same if r["gen"] is not None]
            gen = f"{statistics.median(gens):.3f}" if gens else "-"
            refitted = "yes" if any(r["refitted"] for r in same) else "no"
            lines.append(f"| {policy} | {neighbours} | {statistics.median(steps):.3f}{spread} | "
                         f"{statistics.median(steps) / base:.2f} | {gen} | {len(same)} | {refitted} |")
        fixed = [r["step"] for p, n, r in runs if (p, n) == ("fixed", "alone")]
        if fixed:
            lines += ["", f"Alone, adaptive against fixed: {base / statistics.median(fixed):.3f}x."]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, default=None, help="where the data, model and runs go (a temp dir)")
    parser.add_argument("--steps", type=int, default=12, help="GRPO steps per run (SFT runs three times as many)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each policy alone, alternated")
    parser.add_argument("--only", default=None, help="run only workloads whose name starts with this (e.g. sft)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "contention.md")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="contention_"))
    data, model = prepare(workdir)
    cost = fit_cost()
    results: dict[str, list[tuple[str, str, dict]]] = {}
    for work in workloads(data, model, args.steps):
        if args.only and not work.name.lower().startswith(args.only.lower()):
            continue
        results[work.name] = []
        for i, (policy, neighbours) in enumerate(plan(work, args.repeats)):
            # spinning threads beside a neighbour make each step many times longer: a few steps of it
            slow = policy == "fixed" and neighbours != "alone"
            steps = work.warmup + (1 if work.name.startswith("GRPO") else 10) if slow else work.steps
            run_dir = workdir / "runs" / f"{''.join(c for c in work.name.lower() if c.isalnum())}_{i}"
            shutil.rmtree(run_dir, ignore_errors=True)
            result = run_once(work, policy, neighbours, run_dir, steps)
            results[work.name].append((policy, neighbours, result))
            print(f"{work.name} | {policy} | {neighbours}: step {result['step']:.3f} s", flush=True)
    command = shlex.join(["python", "benchmarks/contention.py", *sys.argv[1:]])
    bench.publish(report(results, command, cost), args.out)


if __name__ == "__main__":
    main()
