"""Where one hybridrl GRPO step's time goes, op by op: torch.profiler over one step on the local backend.

    python benchmarks/profile_step.py --device cuda [--size 400m] [--dtype bfloat16] [--steps 3]
    .venv/bin/python benchmarks/profile_step.py --device cpu --size 10m

Runs `--steps` GRPO steps of `grpo_vs_trl.py`'s workload at `--size` (32 prompts x 8 samples x 64
tokens on a GPU; that script's CPU plan on a CPU) in this process, on the local backend, and records the
last step only: the earlier ones warm up the allocator, library handles and the decoding graph's
capture. It prints, and writes to `--out`:

- the trainer's stage times of the recorded step (`timing_s/*`);
- how many host ops (`aten::*`) and device kernels that step ran, and their summed times: on a GPU a
  phase whose host time exceeds its kernels' time is bound by launching work, not by the device, and
  gets faster with fewer ops rather than with faster kernels;
- the top `--rows` entries by device time (GPU) and by host time (self CPU).

Why it exists: on an H200 (2026-11-26, results/grpo_vs_trl_gpu.md) hybridrl's 1b update ran at 4-10%
of the card's bf16 rate and the CUDA-graph decoding step took ~9 ms where reading the weights takes
under 1 ms; this is the measurement that says which ops to fuse or drop. `--eager` decodes without
CUDA graphs (`rollout.enforce_eager=true`); `--padded` turns `share_prompt_forward` off.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_vs_trl as bench  # noqa: E402  (a sibling script, not a package)

from hybridrl.trainer.ppo_trainer import PPOTrainer  # noqa: E402


def count_and_time(events, prefix: str | None, device: bool) -> tuple[int, float]:
    """(calls, seconds) of the profiler's averaged events: host ops named `prefix*`, or device kernels."""
    calls = seconds = 0
    for e in events:
        if device:
            if e.self_device_time_total > 0 and e.device_type.name != "CPU":
                calls, seconds = calls + e.count, seconds + e.self_device_time_total / 1e6
        elif e.key.startswith(prefix):
            calls, seconds = calls + e.count, seconds + e.self_cpu_time_total / 1e6
    return calls, seconds


def profile_run(w: bench.Workload, graphs: bool, share_prompts: bool, steps: int) -> tuple[object, dict]:
    """Run `steps` steps of `w` and profile the last; returns (the profiler, that step's metrics)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if w.device == "cuda" else [])
    prof = profile(activities=activities, schedule=schedule(wait=steps - 2, warmup=1, active=1),
                   acc_events=True)
    original = PPOTrainer.train_step

    def train_step(self: PPOTrainer) -> dict[str, float]:
        metrics = original(self)
        prof.step()  # the schedule counts trainer steps: record only the last
        return metrics

    PPOTrainer.train_step = train_step
    try:
        with prof, tempfile.TemporaryDirectory(prefix="profile-step-") as tmp:
            result = bench.run_hybridrl(w, "local", Path(tmp), graphs=graphs, share_prompts=share_prompts)
    finally:
        PPOTrainer.train_step = original
    return prof, result["history"][-1]


def report(prof, last: dict, w: bench.Workload, args: argparse.Namespace) -> str:
    events = prof.key_averages()
    ops, op_s = count_and_time(events, "aten::", device=False)
    kernels, kernel_s = count_and_time(events, None, device=True)
    stages = {k.removeprefix("timing_s/"): round(v, 4) for k, v in last.items() if k.startswith("timing_s/")}
    lines = [
        f"# One GRPO step of hybridrl, profiled: {w.size} {w.dtype} on {bench.machine(w.device)}",
        "",
        f"Workload: {w.prompts} prompts x {w.n} samples x {w.response_length} tokens, local backend, step "
        f"{args.steps} of {args.steps} recorded (the earlier ones warm up); decoding "
        f"{'with CUDA graphs' if w.device == 'cuda' and not args.eager else 'eagerly'}, "
        f"share_prompt_forward={str(not args.padded).lower()}; torch {torch.__version__}.",
        "",
        f"Stage seconds of the recorded step (timing_s/*): {json.dumps(stages)}",
        "",
        "The same stages as ranges of the trace (host seconds under the profiler, calls): "
        + ", ".join(f"{e.key} {e.cpu_time_total / 1e6:.3f} ({e.count})" for e in events if e.key in stages),
        "",
        f"Host ops (aten::*) in the step: {ops} calls, {op_s:.3f} s of self CPU time (the profiler's own "
        "cost per op included, so host times here run above an unprofiled step's)."
        + (f" Device kernels: {kernels}, {kernel_s:.3f} s of device time." if w.device == "cuda" else ""),
        "",
    ]
    if w.device == "cuda":
        lines += ["## By device time", "", "```",
                  events.table(sort_by="self_device_time_total", row_limit=args.rows, max_name_column_width=70),
                  "```", ""]
    lines += ["## By host time", "", "```",
              events.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=70), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--size", default=None, help="a tiny preset (default 400m on cuda, 10m on cpu)")
    parser.add_argument("--dtype", default=None,
                        help="compute dtype (default bfloat16, or float32 on a CPU that emulates bf16)")
    parser.add_argument("--steps", type=int, default=3, help="steps run; the last is recorded (at least 2)")
    parser.add_argument("--eager", action="store_true", help="decode without CUDA graphs")
    parser.add_argument("--padded", action="store_true", help="share_prompt_forward=false")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step (default: the size's plan)")
    parser.add_argument("--rows", type=int, default=40, help="rows of each top-ops table")
    parser.add_argument("--workdir", default="runs/profile_step", help="data and models")
    parser.add_argument("--out", type=Path, default=None, help="default runs/profile_step/<size>-<dtype>.md")
    args = parser.parse_args(argv)
    args.dtype = args.dtype or bench.default_dtypes(args.device).split(",")[-1]
    if args.steps < 2:
        raise SystemExit(f"--steps must be at least 2 (one to warm up, one to record), got {args.steps}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU")
    size = args.size or ("400m" if args.device == "cuda" else "10m")
    workdir = Path(args.workdir).resolve()
    (w,) = bench.prepare(workdir, [size], quick=False, device=args.device)
    # no validation: the recorded step must be a training step like the others
    w = dataclasses.replace(w, dtype=args.dtype, steps=args.steps, evaluate=False, prompts=args.prompts or w.prompts)
    prof, last = profile_run(w, graphs=args.device == "cuda" and not args.eager, share_prompts=not args.padded,
                             steps=args.steps)
    text = report(prof, last, w, args)
    out = args.out or workdir / f"{size}-{args.dtype}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"(written to {out})")


if __name__ == "__main__":
    main()
