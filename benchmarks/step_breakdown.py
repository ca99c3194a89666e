"""Where a hybridrl GRPO step spends its time, and how close its model passes come to this CPU's peak.

    .venv/bin/python benchmarks/step_breakdown.py [--quick] [--size 10m]

Runs a few GRPO steps on the local backend (one process) and on Ray (2 worker processes), each in a
fresh subprocess (through grpo_vs_trl.py's runner), and reports per stage the median of the trainer's
own `timing_s/<stage>` over the steps after warm-up, plus:

- overhead: `timing_s/step` minus the sum of the timed stages (driver work between stages: batch
  balancing, unions, metrics);
- Ray transfer: the same calls the trainer makes per step (generate_sequences, compute_log_prob,
  update_actor) with the same tensor shapes in and out, sent to a group of 2 no-op Ray workers through
  hybridrl's own dispatch and collect: what a stage costs on Ray beyond its compute;
- achieved FLOP/s of each model pass, counting only real (attended) tokens: a forward pass is
  ~2 x N_params FLOPs per token (generation, old log-probs) and forward + backward ~6 x N_params
  (the update) (Kaplan et al., 2020, "Scaling Laws for Neural Language Models", section 2.1; attention
  scores add ~2 x layers x context x hidden per token, under 5% here, and are left out);
- the peak it is compared with: the best of several `torch.matmul`s of two 2048 x 2048 matrices
  (2 x 2048^3 FLOPs each) in the run's compute dtype (`--dtype`), measured in this run with the worker's
  thread count: 2 threads for the local
  backend, and twice the 1-thread peak for 2 Ray workers with 1 thread each.

The FLOP counts and the matmul probe are the package's own (`hybridrl.utils.metric`), the ones behind
the `perf/mfu/<pass>` metrics a run logs; this script times with the driver's `timing_s/<stage>`, the
metrics with the workers' `timing_s/<stage>_worker`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_vs_trl as bench  # noqa: E402  (a sibling script, not a package)

from hybridrl.models.loading import resolve_dtype  # noqa: E402
from hybridrl.utils.metric import (  # noqa: E402
    FORWARD_FLOPS_PER_PARAM,
    TRAIN_FLOPS_PER_PARAM,
    matmul_peak_flops,
    model_flops,
)

STAGES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")
# FLOPs per real token and parameter of each model pass (see the module docstring)
PASS_FLOPS = {"gen": FORWARD_FLOPS_PER_PARAM, "old_log_prob": FORWARD_FLOPS_PER_PARAM,
              "ref": FORWARD_FLOPS_PER_PARAM, "update_actor": TRAIN_FLOPS_PER_PARAM}


def matmul_peak(threads: int, dtype: torch.dtype = torch.float32) -> float:
    """Best `dtype` matmul FLOP/s with `threads` torch threads (the probe the workers run at start)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return matmul_peak_flops(dtype)
    finally:
        torch.set_num_threads(previous)


def median_stages(history: list[dict], warmup: int) -> dict[str, float]:
    """stage -> median seconds over the steps after warm-up; plus `step` and `overhead`."""
    kept = history[warmup:]
    out = {}
    for stage in (*STAGES, "step"):
        key = f"timing_s/{stage}"
        if key in kept[0]:
            out[stage] = statistics.median(m[key] for m in kept)
    # overhead per step, then its median (a median of differences, not a difference of medians)
    out["overhead"] = statistics.median(
        m["timing_s/step"] - sum(m.get(f"timing_s/{s}", 0.0) for s in STAGES) for m in kept)
    return out


def achieved_flops(history: list[dict], warmup: int, params: int) -> dict[str, float]:
    """stage -> median achieved FLOP/s of the model pass, from real tokens and the stage's time."""
    kept = history[warmup:]
    out = {}
    for stage, per_token in PASS_FLOPS.items():
        key = f"timing_s/{stage}"
        if key in kept[0]:
            out[stage] = statistics.median(model_flops(params, m["perf/total_num_tokens"], per_token) / m[key]
                                           for m in kept)
    return out


def shared_prompt_share(history: list[dict], warmup: int, prompts: int) -> float:
    """Median share of a step's real tokens that the update computes when each prompt is computed once
    per group (actor_rollout_ref.model.share_prompt_forward, on by default): prompts x mean prompt length
    + samples x mean response length, over all real tokens."""
    shares = []
    for m in history[warmup:]:
        prompt, response, total = m["prompt_length/mean"], m["response_length/mean"], m["perf/total_num_tokens"]
        samples = total / (prompt + response)
        shares.append((prompts * prompt + samples * response) / total)
    return statistics.median(shares)


# ----- Ray transfer: the step's three worker calls, with its tensor shapes, on no-op workers ---------------
def ray_transfer_seconds(w: bench.Workload, calls: int = 5) -> dict[str, float]:
    """call -> median seconds of a no-op round trip through hybridrl's Ray worker group (2 ranks)."""
    import ray

    from hybridrl.controller.decorator import Dispatch, register
    from hybridrl.controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, init_ray
    from hybridrl.controller.worker import Worker
    from hybridrl.protocol import DataProto

    class NoOpWorker(Worker):
        """Answers each call at once with tensors shaped as the real stage's output."""

        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def reply(self, data: DataProto) -> DataProto:
            shapes = data.meta_info["reply"]
            rows = len(data) * data.meta_info["reply_repeat"]  # the rollout answers n rows per prompt
            return DataProto.from_dict({key: torch.zeros(rows, cols, dtype=getattr(torch, dtype))
                                        for key, (cols, dtype) in shapes.items()})

    payloads = step_payloads(w)
    init_ray(num_cpus=os.cpu_count() or 2)
    try:
        group = RayWorkerGroup(RayResourcePool([2]), RayClassWithInitArgs(NoOpWorker))
        out = {}
        for name, (request, reply) in payloads.items():
            request.meta_info["reply"] = reply
            request.meta_info["reply_repeat"] = w.n if name == "generate_sequences" else 1
            times = []
            for _ in range(calls + 1):  # the first call also ships the worker's code: left out
                start = time.perf_counter()
                group.call("reply", request)
                times.append(time.perf_counter() - start)
            out[name] = statistics.median(times[1:])
        return out
    finally:
        ray.shutdown()


def step_payloads(w: bench.Workload) -> dict[str, tuple]:
    """call -> (request DataProto, reply shapes) as the trainer sends them for one step of `w`.

    Tensor contents do not change what Ray moves (pickled tensor bytes), so they are zeros; the keys,
    dtypes and shapes are the trainer's (docs/architecture.md, "The batch").
    """
    import numpy as np

    from hybridrl.protocol import DataProto

    rows, prompt, response = w.samples, w.prompt_length, w.response_length
    width = prompt + response

    def tensors(spec: dict[str, tuple[int, torch.dtype]], n_rows: int) -> dict[str, torch.Tensor]:
        return {key: torch.zeros(n_rows, cols, dtype=dtype) for key, (cols, dtype) in spec.items()}

    long, f32 = torch.int64, torch.float32
    prompts = {k: (prompt, long) for k in ("input_ids", "attention_mask", "position_ids")}
    rollout = {"prompts": (prompt, long), "responses": (response, long), "input_ids": (width, long),
               "attention_mask": (width, long), "position_ids": (width, long), "response_mask": (response, long),
               "rollout_log_probs": (response, f32), "token_level_scores": (response, f32)}
    update = {**rollout, **{k: (response, f32) for k in ("old_log_probs", "token_level_rewards", "advantages",
                                                         "returns")}}
    uids = {"uid": np.array([f"{i // w.n}" for i in range(rows)], dtype=object)}

    def proto(spec: dict, n_rows: int, non_tensors: dict | None = None) -> DataProto:
        return DataProto.from_dict(tensors(spec, n_rows), non_tensors=non_tensors or {})

    def as_names(spec: dict) -> dict:
        return {key: (cols, str(dtype).removeprefix("torch.")) for key, (cols, dtype) in spec.items()}

    return {
        "generate_sequences": (proto(prompts, w.prompts), as_names(rollout)),
        # one mini-batch, one epoch: the update's forward pass gives the old log-probs and returns them
        "update_actor": (proto({k: v for k, v in update.items() if k != "old_log_probs"}, rows, uids),
                         as_names({"old_log_probs": (response, f32)})),
    }


# ----- report ---------------------------------------------------------------------------------------------
def breakdown_table(runs: dict[str, dict], peaks: dict[str, float], transfer: dict[str, float] | None,
                    header: str, dtype: str = "float32") -> str:
    """The table; a run with `computed_share` adds what its update executes over the tokens it computes."""
    backends = list(runs)
    lines = [header, "", "| stage | " + " | ".join(f"{b}: s (% of step) | {b}: GFLOP/s (% of peak)"
                                                   for b in backends) + " |",
             "|---|" + "---:|---:|" * len(backends)]
    stages = [s for s in (*STAGES, "overhead", "step") if any(s in r["stages"] for r in runs.values())]
    for stage in stages:
        cells = []
        for backend in backends:
            run = runs[backend]
            seconds = run["stages"].get(stage)
            step = run["stages"]["step"]
            cells.append("-" if seconds is None else f"{seconds:.3f} ({100 * seconds / step:.0f}%)")
            flops = run["flops"].get(stage)
            peak = peaks[backend]
            cells.append("-" if flops is None else f"{flops / 1e9:.1f} ({100 * flops / peak:.0f}%)")
        label = {"overhead": "overhead (step - stages)", "step": "**step total**"}.get(stage, stage)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    computed = [(b, r["computed_share"], r["flops"]["update_actor"]) for b, r in runs.items()
                if r.get("computed_share") and "update_actor" in r["flops"]]
    if computed:
        lines.append("The update computes each prompt once per group (share_prompt_forward): "
                     + "; ".join(f"{b} {100 * share:.0f}% of the real tokens, so it executes "
                                 f"{share * flops / 1e9:.1f} GFLOP/s ({100 * share * flops / peaks[b]:.0f}% of peak)"
                                 for b, share, flops in computed) + ".")
    lines.append(f"Peak {dtype} matmul (2048 x 2048, best of 6) in this run: "
                 + ", ".join(f"{b} {peaks[b] / 1e9:.1f} GFLOP/s" for b in backends) + ".")
    if transfer:
        ray_step = runs.get("ray", {}).get("stages", {}).get("step")
        total = sum(transfer.values())
        share = f" = {100 * total / ray_step:.0f}% of the Ray step" if ray_step else ""
        lines.append("Ray transfer per step (no-op workers, same calls and tensor shapes, median of 5): "
                     + ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in transfer.items())
                     + f"; total {total * 1000:.0f} ms{share}.")
    return "\n".join(lines)


def chart(runs: dict[str, dict], peaks: dict[str, float], out_png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8), gridspec_kw={"wspace": 0.45})
    backends = list(runs)
    stages = [s for s in (*STAGES, "overhead") if any(s in r["stages"] for r in runs.values())]
    for i, backend in enumerate(backends):
        start = 0.0
        for j, stage in enumerate(stages):
            seconds = runs[backend]["stages"].get(stage, 0.0)
            left.barh(i, seconds, left=start, color=f"C{j}", label=stage if i == 0 else None)
            start += seconds
    left.set_yticks(range(len(backends)), backends)
    left.set_xlabel("seconds per step (median)")
    left.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    passes = [p for p in PASS_FLOPS if any(p in r["flops"] for r in runs.values())]
    width = 0.8 / len(backends)
    for i, backend in enumerate(backends):
        values = [100 * runs[backend]["flops"].get(p, 0.0) / peaks[backend] for p in passes]
        right.bar([k + i * width for k in range(len(passes))], values, width, label=backend)
    right.set_xticks([k + width * (len(backends) - 1) / 2 for k in range(len(passes))], passes)
    right.set_ylabel("% of measured matmul peak (run's dtype)")
    right.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.savefig(out_png, dpi=100, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1m model, 3 short steps per backend (~2 min)")
    parser.add_argument("--size", default=None, help="tiny model size (default 10m; 1m with --quick)")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps per backend (default 6; 3 quick)")
    parser.add_argument("--backends", default="local,ray", help="subset of local,ray")
    parser.add_argument("--dtype", default="float32", help="compute dtype (float32, bfloat16, auto)")
    parser.add_argument("--workdir", default="runs/bench_step_breakdown", help="data, model and run logs")
    parser.add_argument("--out", default=str(bench.RESULTS / "step_breakdown"), help="writes OUT.md and OUT.png")
    args = parser.parse_args(argv)
    size = args.size or ("1m" if args.quick else "10m")
    steps = args.steps or (3 if args.quick else 6)
    workdir = Path(args.workdir).resolve()
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    w = bench.prepare(workdir, [size], quick=True)[0]  # an untrained model: speed, not learning
    w.steps, w.warmup, w.evaluate = steps, 1, False
    w.prompts, w.response_length = 16, 32 if args.quick else 64
    w.dtype = str(resolve_dtype(args.dtype)).removeprefix("torch.")
    dtype = resolve_dtype(w.dtype)
    params = bench.count_params(w.model)
    peaks_before = {1: matmul_peak(1, dtype), 2: matmul_peak(2, dtype)}
    runs = {}
    for backend in args.backends.split(","):
        row = bench.measure(f"hybridrl-{backend}", w, workdir / "logs")
        history = row["raw"]["history"]
        runs[backend] = {"stages": median_stages(history, w.warmup),
                         "flops": achieved_flops(history, w.warmup, params),
                         "computed_share": shared_prompt_share(history, w.warmup, w.prompts)}
        print(f"{backend}: {runs[backend]['stages']['step']:.2f} s/step", flush=True)
    transfer = ray_transfer_seconds(w) if "ray" in runs else None
    peaks_after = {1: matmul_peak(1, dtype), 2: matmul_peak(2, dtype)}
    best = {k: max(peaks_before[k], peaks_after[k]) for k in (1, 2)}
    # local: one process with torch's default threads (one per core); ray: 2 workers x 1 thread each
    peaks = {"local": best[torch.get_num_threads()], "ray": 2 * best[1]}
    header = (
        f"hybridrl GRPO step breakdown, {size} Qwen2 ({params / 1e6:.1f}M parameters, untrained), "
        f"{w.prompts} prompts x {w.n} samples x {w.response_length} tokens, {w.dtype}, medians over {steps - 1} "
        f"steps after 1 warm-up, on a {bench.machine()}, {time.strftime('%Y-%m-%d')}, 1-min load "
        f"average at the end {os.getloadavg()[0]:.1f}. local = 1 process, {torch.get_num_threads()} torch threads; "
        f"ray = 2 worker processes x 1 thread. GFLOP/s count real tokens only: 2N per token for generation "
        f"and log-probs, 6N for the update."
    )
    text = breakdown_table(runs, {b: peaks[b] for b in runs}, transfer, header, w.dtype)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text + "\n")
    chart(runs, {b: peaks[b] for b in runs}, out.with_suffix(".png"),
          f"hybridrl GRPO step, {size} model on {os.cpu_count()} CPU cores")
    print(text)


if __name__ == "__main__":
    main()
