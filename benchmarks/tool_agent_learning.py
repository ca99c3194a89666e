"""Does the tool-use demo learn on any machine? `examples/tool_agent.py` over seeds x thread counts.

    python benchmarks/tool_agent_learning.py [--seeds 0,1,2] [--threads 1,2] [--workdir runs/tool_agent_bench]

Each run is `python examples/tool_agent.py --seed S --threads T` in a subprocess, in its own
directory under `--workdir` (a finished run, one with `summary.json`, is reused), one run at a time so
each has the machine's cores to itself. Seeds (task data, model init, SFT order) and thread counts (1 or
2 per process) stand in for other CPUs, whose kernels sum floating-point numbers in another order.

Writes `benchmarks/results/tool_agent.md`: per run the held-out greedy accuracy and tool calls per sample
before and after GRPO, and the run's minutes; the issue's bar is +10 points of accuracy on every run,
with tool calls per sample rising, in at most 10 minutes. The last line printed is `min gain: <points>`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from learning import cpu_name, thread_env  # noqa: E402  (benchmarks/ is not a package)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
EXAMPLE = REPO / "examples" / "tool_agent.py"
TARGET_GAIN = 0.10
TARGET_MINUTES = 10.0


def run(workdir: Path, seed: int, threads: int) -> dict:
    out = workdir / f"seed{seed}_threads{threads}"
    summary = out / "summary.json"
    if not summary.exists():
        out.mkdir(parents=True, exist_ok=True)
        with (out / "tool_agent.log").open("w") as log:
            subprocess.run([sys.executable, str(EXAMPLE), "--workdir", str(out),
                            "--seed", str(seed), "--threads", str(threads)],
                           check=True, env=thread_env(threads), stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    return json.loads(summary.read_text())


def report(runs: list[tuple[int, int, dict]], missing: list[str]) -> tuple[str, float]:
    lines = [
        "# Tool-use demo: held-out accuracy and tool calls over seeds and thread counts",
        "",
        f"CPU: {cpu_name()}. Command: `python benchmarks/tool_agent_learning.py` "
        "(each run: `python examples/tool_agent.py --seed S --threads T`, one at a time).",
        f"Bar: accuracy +{TARGET_GAIN:.2f} or more on every run, tool calls per sample rising, "
        f"<= {TARGET_MINUTES:.0f} minutes per run.",
        "",
        "| seed | threads | accuracy before | after | gain | tool calls/sample before | after | minutes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    gains = []
    for seed, threads, s in runs:
        before, after = s["held-out accuracy before"], s["held-out accuracy after"]
        calls_before = s["held-out tool calls per sample before"]
        calls_after = s["held-out tool calls per sample after"]
        gains.append(after - before)
        lines.append(f"| {seed} | {threads} | {before:.3f} | {after:.3f} | {after - before:+.3f} | "
                     f"{calls_before:.2f} | {calls_after:.2f} | {s['total minutes']:.1f} |")
    lines += ["", f"min gain {min(gains):+.3f}, mean {sum(gains) / len(gains):+.3f}; longest run "
                  f"{max(s['total minutes'] for _, _, s in runs):.1f} minutes."]
    if missing:
        lines += ["", f"Not run (--only-finished): {', '.join(missing)}."]
    return "\n".join(lines) + "\n", min(gains)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--workdir", default="runs/tool_agent_bench")
    parser.add_argument("--only-finished", action="store_true",
                        help="report the finished runs and name the others, instead of running them")
    args = parser.parse_args()
    workdir = Path(args.workdir).resolve()
    runs, missing = [], []
    for seed in (int(s) for s in args.seeds.split(",")):
        for threads in (int(t) for t in args.threads.split(",")):
            if args.only_finished and not (workdir / f"seed{seed}_threads{threads}" / "summary.json").exists():
                missing.append(f"seed {seed} with {threads} thread(s)")
                continue
            print(f"seed {seed}, {threads} thread(s) ...", flush=True)
            runs.append((seed, threads, run(workdir, seed, threads)))
    table, min_gain = report(runs, missing)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "tool_agent.md").write_text(table)
    print(table)
    print(f"min gain: {min_gain * 100:+.1f}")


if __name__ == "__main__":
    os.chdir(REPO)
    main()
