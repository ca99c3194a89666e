"""What starting a run costs: the wall time of a 1-step tiny GRPO run on 2 Ray ranks, the cluster already up.

    python benchmarks/run_start.py --runs 5 [--out benchmarks/results/run_start.md]

Each run is `run_ppo` with the tests' few-second settings (tests/trainer/ppo_helpers.py: 4 prompts x 4 samples,
16 response tokens, the 1m tiny model) on a Ray cluster this script starts once; the report gives the median wall
time of a run and of its one step, so the difference is the start-up (worker processes, imports, models, the MFU
probe) and the shut-down. Run it alone: another busy process on the machine changes every figure.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "trainer"), str(REPO / "tests")]


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    from ppo_helpers import ppo_config, tiny_run_overrides

    from hybridrl.controller.ray import init_ray
    from hybridrl.models.tiny import build_tiny_model
    from hybridrl.trainer.main_ppo import run_ppo

    work = Path(tempfile.mkdtemp(prefix="run_start_"))
    subprocess.run([sys.executable, "-m", "hybridrl.data.tasks.arithmetic", "--out", str(work / "data")], check=True,
                   capture_output=True)
    model = build_tiny_model(work / "model", arch="qwen2", size="1m", seed=0)
    init_ray(num_cpus=2)
    walls, steps = [], []
    for run in range(args.runs + 1):  # the first run warms the OS's file cache and Ray's worker pool
        start = time.perf_counter()
        history = run_ppo(ppo_config(*tiny_run_overrides(work / "data", model, work / f"run{run}"),
                                     "trainer.total_training_steps=1"))
        if run:
            walls.append(time.perf_counter() - start)
            steps.append(history[0]["timing_s/step"])
    wall, step = statistics.median(walls), statistics.median(steps)
    report = "\n".join([
        "# Starting a run", "",
        f"CPU: {cpu_name()}, {len(__import__('os').sched_getaffinity(0))} cores; command: "
        f"`python benchmarks/run_start.py --runs {args.runs}`; medians of {args.runs} runs after a warm-up run.", "",
        "| run wall s | its step s | start + stop s |", "|---:|---:|---:|",
        f"| {wall:.2f} | {step:.2f} | {wall - step:.2f} |", "",
    ])
    print(report)
    if args.out:
        args.out.write_text(report)
    return report


if __name__ == "__main__":
    main()
