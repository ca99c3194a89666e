"""GRPO side by side: hybridrl (1 process, and 2 Ray workers) against TRL's GRPOTrainer, on identical work.

    python3 -m venv benchmarks/.venv-trl && benchmarks/.venv-trl/bin/pip install -r benchmarks/requirements-trl.txt
    benchmarks/.venv-trl/bin/python benchmarks/grpo_vs_trl.py [--quick] [--sizes 1m,10m,50m]
    python benchmarks/grpo_vs_trl.py --device cuda [--sizes 10m,50m,400m,1b]   (one GPU; TRL and its deps installed;
        runners trl, hybridrl-local and hybridrl-local-graphs: the last decodes with CUDA graphs)

Identical work per size: the same model directory (a tiny Qwen2 from hybridrl's factory; the 1m one
warm-started by SFT so held-out accuracy means something), the same tokenizer object type, the same
prompts (the arithmetic train parquet's chat prompts), the same reward (hybridrl's arithmetic scorer,
wrapped as a TRL reward function), prompts per step, samples per prompt, response length, temperature
1.0, learning rate, AdamW (weight decay 0.01, grad clip 1.0, constant schedule), no KL and no
reference model, one PPO epoch with one optimizer step per step, and token-mean loss aggregation
(TRL's default `loss_type="dapo"` normalises by the active tokens of the whole accumulated batch,
which is hybridrl's `loss_agg_mode=token-mean` over one mini-batch holding the whole step).

Each framework runs in its own subprocess; a sampler in this process reads the peak memory of that
process tree. Times are medians over the steps after the warm-up steps. The last line printed is
`speedup vs TRL: <ratio>x`: the smallest per-size ratio of samples per second, hybridrl's faster
backend over TRL.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
ACCURACY_KEY = "val-core/arithmetic/reward/mean@1"
RUNNERS = ("trl", "hybridrl-local", "hybridrl-ray", "hybridrl-local-graphs", "hybridrl-local-padded")
# hybridrl-local-graphs: the local backend with rollout.enforce_eager=false, CUDA-graph decoding (GPU only)
GRAPHS = "-graphs"
# hybridrl-local-padded: the local backend with actor_rollout_ref.model.share_prompt_forward=false, every row
# computing its own copy of its prompt in the update (what that sharing saves, measured in the same run)
PADDED = "-padded"
DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
HISTORY_KEYS = ("timing_s/", "perf/", "response_length/", "prompt_length/")


@dataclass
class Workload:
    """One model size's GRPO job, run identically by every framework."""

    size: str
    model: str  # Hugging Face model directory
    start: str  # how the model was initialised, for the table
    data: str  # directory with train.parquet / test.parquet
    prompts: int  # prompts per step
    n: int  # samples per prompt
    response_length: int
    steps: int
    warmup: int  # leading steps left out of the medians
    evaluate: bool  # held-out greedy accuracy before and after training
    lr: float = 5e-5
    micro_batch: int = 32  # samples per forward/backward pass (hybridrl's micro batch, TRL's device batch)
    # (DEFAULT_MICRO_BATCH below mirrors it: a run at another size gets its own log and row files)
    prompt_length: int = 40
    seed: int = 1
    dtype: str = "float32"  # compute dtype: hybridrl's param_dtype and rollout.dtype, TRL's bf16 flag
    device: str = "cpu"  # hybridrl's trainer.device; TRL's use_cpu=(device == "cpu")

    @property
    def tag(self) -> str:
        micro = "" if self.micro_batch == DEFAULT_MICRO_BATCH else f"-mb{self.micro_batch}"
        return f"{self.size}-{self.dtype}{micro}"

    @property
    def samples(self) -> int:
        return self.prompts * self.n


DEFAULT_MICRO_BATCH = Workload.micro_batch


# ----- running one framework (inside a subprocess) ------------------------------------------------------
def run_hybridrl(w: Workload, backend: str, workdir: Path, graphs: bool = False, share_prompts: bool = True) -> dict:
    """hybridrl's own entry point on the composed config; per-step wall times between its step logs."""
    from hydra import compose, initialize_config_dir

    from hybridrl.trainer.main_ppo import run_ppo

    ranks = 2 if backend == "ray" else 1
    actor = "actor_rollout_ref.actor"
    overrides = [
        f"data.train_files={w.data}/train.parquet",
        f"data.val_files={w.data}/test.parquet" if w.evaluate else "data.val_files=null",
        f"data.train_batch_size={w.prompts}", f"data.max_prompt_length={w.prompt_length}",
        f"data.max_response_length={w.response_length}", f"data.seed={w.seed}",
        f"actor_rollout_ref.model.path={w.model}", "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.rollout.n={w.n}", "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={w.micro_batch}",
        f"{actor}.ppo_mini_batch_size={w.prompts}", f"{actor}.ppo_micro_batch_size_per_gpu={w.micro_batch}",
        f"{actor}.ppo_epochs=1", f"{actor}.optim.lr={w.lr}", f"{actor}.use_kl_loss=false",
        f"{actor}.loss_agg_mode=token-mean", f"{actor}.entropy_coeff=0.0", "algorithm.use_kl_in_reward=false",
        f"{actor}.fsdp_config.mixed_precision.param_dtype={w.dtype}", f"actor_rollout_ref.rollout.dtype={w.dtype}",
        f"trainer.backend={backend}", f"trainer.n_gpus_per_node={ranks}", f"trainer.device={w.device}",
        f"trainer.total_training_steps={w.steps}", f"trainer.test_freq={w.steps if w.evaluate else -1}",
        f"trainer.val_before_train={str(w.evaluate).lower()}", "trainer.save_freq=-1",
        f"trainer.default_local_dir={workdir}", "trainer.resume_mode=disable", "trainer.logger=[console]",
        f"actor_rollout_ref.rollout.enforce_eager={str(not graphs).lower()}",
        f"actor_rollout_ref.model.share_prompt_forward={str(share_prompts).lower()}",
    ]
    config_dir = str(REPO / "hybridrl" / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    history = run_ppo(cfg)
    steps = [m for m in history if "timing_s/step" in m]
    validations = [m[ACCURACY_KEY] for m in history if ACCURACY_KEY in m]
    # Wall time from one step's log to the next, as TRL's side is timed: the trainer's `timing_s/step`
    # leaves out per-step metrics and logging. Step 1 has no previous log, and a step that ran
    # validation after training is not comparable: both are None.
    clock = [m["training/time"] for m in steps]
    wall = [None] + [b - a for a, b in zip(clock, clock[1:], strict=False)]
    if w.evaluate:
        wall[-1] = None
    return {
        "step_s": wall,
        "gen_tokens": [m["response_length/mean"] * w.samples for m in steps],
        "score": [m["critic/score/mean"] for m in steps],
        "acc_before": validations[0] if w.evaluate else None,
        "acc_after": validations[-1] if w.evaluate else None,
        # per-step timings and sizes, for step_breakdown.py
        "history": [{k: float(v) for k, v in m.items() if k.startswith(HISTORY_KEYS)} for m in steps],
    }


def _trl_reward(completions, data_source, reward_model, **_) -> list[float]:
    """hybridrl's scorer for each completion, in TRL's reward-function signature."""
    from hybridrl.rewards.scorers import default_compute_score

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]  # chat or plain
    return [float(default_compute_score(src, text, rm["ground_truth"]))
            for src, text, rm in zip(data_source, texts, reward_model, strict=True)]


def trl_trainer(w: Workload, workdir: Path, callbacks: list | None = None, **overrides):
    """TRL's GRPOTrainer on CPU as the docs set it up, with every knob that changes the work matched.

    One generation batch of prompts x n samples, trained in micro-batches that accumulate into one
    optimizer step, as hybridrl's one mini-batch of `micro_batch`-sample passes does; `overrides` change
    GRPOConfig fields (e.g. more optimizer steps per generation batch).
    """
    import datasets
    from trl import GRPOConfig, GRPOTrainer

    from hybridrl.models.loading import load_tokenizer

    columns = ["prompt", "data_source", "reward_model"]
    train = datasets.Dataset.from_parquet(f"{w.data}/train.parquet", columns=columns)
    tokenizer = load_tokenizer(w.model, padding_side="left")
    settings = dict(
        output_dir=str(workdir), use_cpu=w.device == "cpu", bf16=w.dtype == "bfloat16", report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, seed=w.seed, max_steps=w.steps,
        per_device_train_batch_size=w.micro_batch, gradient_accumulation_steps=w.samples // w.micro_batch,
        num_generations=w.n, max_completion_length=w.response_length, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=w.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.01, max_grad_norm=1.0,
        beta=0.0, num_iterations=1, epsilon=0.2, loss_type="dapo", scale_rewards="group",
        # TRL turns gradient checkpointing on by default; hybridrl leaves it off, and recomputing
        # activations would be extra work, not the same work.
        gradient_checkpointing=False,
    )
    settings.update(overrides)
    return GRPOTrainer(model=w.model, reward_funcs=_trl_reward, args=GRPOConfig(**settings), train_dataset=train,
                       processing_class=tokenizer, callbacks=callbacks or [])


def run_trl(w: Workload, workdir: Path) -> dict:
    """TRL's GRPOTrainer (`trl_trainer`) timed between optimizer steps."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        """Wall time between optimizer steps (generation happens inside the step that uses it)."""

        def __init__(self) -> None:
            self.marks: list[float] = []
            self.logs: list[dict] = []

        def on_train_begin(self, args, state, control, **kwargs):
            self.marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.marks.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                self.logs.append(dict(logs))

    clock = StepClock()
    trainer = trl_trainer(w, workdir, callbacks=[clock])
    tokenizer = trainer.processing_class
    before = greedy_accuracy(trainer.model, tokenizer, w) if w.evaluate else None
    trainer.train()
    after = greedy_accuracy(trainer.model, tokenizer, w) if w.evaluate else None
    lengths = [log["completions/mean_length"] for log in clock.logs]
    return {
        "step_s": [b - a for a, b in zip(clock.marks, clock.marks[1:], strict=False)],
        "gen_tokens": [length * w.samples for length in lengths],
        "score": [log["reward"] for log in clock.logs],
        "acc_before": before,
        "acc_after": after,
        "dtype": str(trainer.model.dtype),
    }


def greedy_accuracy(model, tokenizer, w: Workload, batch: int = 100) -> float:
    """Mean arithmetic score of greedy responses to the test prompts (what hybridrl's validation does)."""
    import pyarrow.parquet as pq
    import torch

    from hybridrl.rewards.scorers import default_compute_score

    rows = pq.read_table(f"{w.data}/test.parquet").to_pylist()
    model.eval()
    scores = []
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        texts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
                 for r in chunk]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=False, max_new_tokens=w.response_length,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        answers = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        scores += [float(default_compute_score(r["data_source"], a, r["reward_model"]["ground_truth"]))
                   for r, a in zip(chunk, answers, strict=True)]
    model.train()
    return sum(scores) / len(scores)


def run_one(runner: str, w: Workload, out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix=f"bench-{runner}-") as tmp:
        if runner == "trl":
            result = run_trl(w, Path(tmp))
        else:
            backend = runner.removeprefix("hybridrl-").removesuffix(GRAPHS).removesuffix(PADDED)
            result = run_hybridrl(w, backend, Path(tmp), graphs=runner.endswith(GRAPHS),
                                  share_prompts=not runner.endswith(PADDED))
    out.write_text(json.dumps(result))


# ----- the driver: prepare, run each framework in a subprocess, measure, report ---------------------------
class TreeMemory(threading.Thread):
    """Peak memory of a process tree: the root's RSS and the summed PSS of the root and its descendants.

    PSS (proportional set size) splits shared pages among the processes that map them, so the sum over
    Ray's several processes is not inflated by every process counting the same torch libraries.
    """

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.every_s = pid, every_s
        self.peak_root_rss_kb = 0
        self.peak_tree_pss_kb = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            pids = _descendants(self.pid)
            self.peak_root_rss_kb = max(self.peak_root_rss_kb, _smaps_kb(self.pid, "Rss"))
            self.peak_tree_pss_kb = max(self.peak_tree_pss_kb, sum(_smaps_kb(p, "Pss") for p in pids))
            self._stop_event.wait(self.every_s)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # the process ended while we looked
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _smaps_kb(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure(runner: str, w: Workload, logdir: Path, suffix: str = "") -> dict:
    """Run one framework on one workload in a fresh process; summarise its steps after warm-up."""
    out = logdir / f"{runner}-{w.tag}{suffix}.json"
    log = logdir / f"{runner}-{w.tag}{suffix}.log"
    # A child inheriting torch.distributed's rank variables (TRL through accelerate) would try to join
    # that group. hybridrl's runs restore them when they end (the SFT warm start in this process among
    # them); they are dropped here too for a parent started by a launcher such as torchrun.
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    env.update({"HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"})
    cmd = [sys.executable, str(Path(__file__).resolve()), "--run-one", runner, "--workload",
           json.dumps(asdict(w)), "--result", str(out)]
    start = time.perf_counter()
    with open(log, "w") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        memory = TreeMemory(proc.pid)
        memory.start()
        code = proc.wait()
        memory.stop()
    if code != 0:
        raise RuntimeError(f"{runner} on {w.tag} failed (exit {code}); see {log}")
    raw = json.loads(out.read_text())
    kept = [(s, t) for s, t in zip(raw["step_s"][w.warmup:], raw["gen_tokens"][w.warmup:], strict=True)
            if s is not None]
    if not kept:
        raise RuntimeError(f"{runner} on {w.tag}: no timed step after {w.warmup} warm-up steps; raise --steps")
    step_s = statistics.median(s for s, _ in kept)
    return {
        "runner": runner, "size": w.size, "dtype": w.dtype, "start": w.start, "steps": len(raw["step_s"]), "timed": len(kept),
        "step_s": step_s,
        "kept": [list(step) for step in kept],
        "tokens_per_s": statistics.median(t / s for s, t in kept),
        "samples_per_s": w.samples / step_s,
        "root_rss_gb": memory.peak_root_rss_kb / 2**20,
        "tree_pss_gb": memory.peak_tree_pss_kb / 2**20,
        "acc_before": raw["acc_before"], "acc_after": raw["acc_after"],
        "score_last": raw["score"][-1] if raw["score"] else None,
        "wall_s": time.perf_counter() - start,
        "raw": raw,
    }



# size -> (prompts per step, steps, warm-up steps) for the full run and for --quick. A 50m sample costs
# ~4x a 10m one on 2 cores (results/rollout_bench.md: 660 vs 2,400 generated tokens/s), so 50m gets half
# the prompts, to keep the whole run near 20 minutes; it gets as many steps as 10m, since with 3 (two
# timed) one slow step moved its ratio by a tenth.
PLAN = {
    False: {"1m": (16, 20, 2), "10m": (16, 6, 2), "50m": (8, 6, 2)},
    True: {"1m": (16, 4, 1), "10m": (8, 3, 1), "50m": (4, 2, 1)},
}
SAMPLES_PER_PROMPT = 8
# On one GPU (--device cuda): 32 prompts x 8 samples per step at every size, up to the 1.5B layout.
PLAN_GPU = {
    False: {size: (32, 8, 2) for size in ("10m", "50m", "400m", "1b")},
    True: {size: (32, 3, 1) for size in ("10m", "50m", "400m", "1b")},
}


def prepare(workdir: Path, sizes: list[str], quick: bool, device: str = "cpu",
            micro_batch: int = DEFAULT_MICRO_BATCH) -> list[Workload]:
    """Data, models and per-size workloads. The 1m model is warm-started by SFT (skipped with --quick)."""
    from hybridrl.models.tiny import build_tiny_model
    from hybridrl.quickstart import prepare_data, warm_start

    plan = (PLAN if device == "cpu" else PLAN_GPU)[quick]
    # all checks before building anything: a 1b model takes minutes and gigabytes to write
    unplanned = [size for size in sizes if size not in plan]
    if unplanned:
        raise SystemExit(f"--sizes: no plan for {', '.join(unplanned)} on {device}; choose from {', '.join(plan)}")
    uneven = [f"{size} ({plan[size][0] * SAMPLES_PER_PROMPT})" for size in sizes
              if micro_batch < 1 or plan[size][0] * SAMPLES_PER_PROMPT % micro_batch]
    if uneven:
        raise SystemExit(f"--micro-batch {micro_batch} must divide the samples per step of every size: "
                         f"{', '.join(uneven)} (TRL accumulates whole micro-batches)")
    data = prepare_data(workdir)
    workloads = []
    for size in sizes:
        base = workdir / f"base_{size}"
        if not (base / "config.json").exists():
            build_tiny_model(base, arch="qwen2", size=size, seed=0)
        model, start = base, "untrained"
        if size == "1m" and not quick:
            model, start = warm_start(workdir, data, base), "SFT warm start"
        prompts, steps, warmup = plan[size]
        workloads.append(Workload(size=size, model=str(model), start=start, data=str(data), prompts=prompts,
                                  n=SAMPLES_PER_PROMPT, response_length=32 if quick else 64, steps=steps,
                                  warmup=warmup, evaluate=size == "1m", device=device, micro_batch=micro_batch))
    return workloads


def count_params(model_dir: str) -> int:
    """Parameters stored in the checkpoint (tied embeddings are stored, and counted, once)."""
    from safetensors import safe_open

    with safe_open(f"{model_dir}/model.safetensors", framework="pt") as f:
        return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())  # noqa: SIM118


def fastest_trl(rows: list[dict], size: str) -> dict | None:
    """TRL's fastest configuration (dtype) at `size`: the bar hybridrl is measured against."""
    trl = [r for r in rows if r["size"] == size and r["runner"] == "trl"]
    return max(trl, key=lambda r: r["samples_per_s"]) if trl else None


def ratio_vs_trl(rows: list[dict]) -> dict[str, tuple[float, str]]:
    """size -> (samples/s of hybridrl's fastest backend and dtype over TRL's fastest, that configuration)."""
    out = {}
    for size in dict.fromkeys(r["size"] for r in rows):
        trl = fastest_trl(rows, size)
        ours = [r for r in rows if r["size"] == size and r["runner"] != "trl" and not r["runner"].endswith(PADDED)]
        if trl and ours:
            best = max(ours, key=lambda r: r["samples_per_s"])
            out[size] = (best["samples_per_s"] / trl["samples_per_s"], f"{best['runner']} {best['dtype']} vs "
                         f"trl {trl['dtype']}")
    return out


def merge_rounds(rounds: list[dict], w: Workload) -> dict:
    """One row from a runner's alternating rounds on one workload: medians over every round's timed steps
    pooled (so a round the machine ran slow moves the median by its steps' share, not by a whole row), the
    largest memory peaks, the median held-out accuracy after training; `round_step_s` keeps each round's
    own median."""
    if len(rounds) == 1:
        return rounds[0]
    kept = [step for r in rounds for step in r["kept"]]
    step_s = statistics.median(s for s, _ in kept)
    accs = [r["acc_after"] for r in rounds if r["acc_after"] is not None]
    return {
        **rounds[0],
        "timed": len(kept), "kept": kept, "step_s": step_s,
        "tokens_per_s": statistics.median(t / s for s, t in kept),
        "samples_per_s": w.samples / step_s,
        "root_rss_gb": max(r["root_rss_gb"] for r in rounds),
        "tree_pss_gb": max(r["tree_pss_gb"] for r in rounds),
        "acc_after": statistics.median(accs) if accs else None,
        "wall_s": sum(r["wall_s"] for r in rounds),
        "round_step_s": [r["step_s"] for r in rounds],
        "raw": [r["raw"] for r in rounds],
    }


def table(rows: list[dict], workloads: list[Workload], header: str) -> str:
    lines = [header, "",
             "| size (params, start) | framework | dtype | steps (timed) | s/step | gen tokens/s | samples/s "
             "| vs TRL's fastest | peak RSS main (GB) | peak PSS all procs (GB) | held-out greedy acc before -> after |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    by_size = {w.size: w for w in workloads}
    for r in rows:
        w = by_size[r["size"]]
        trl = fastest_trl(rows, r["size"])
        vs = f"{r['samples_per_s'] / trl['samples_per_s']:.2f}x" if trl else "-"
        acc = f"{r['acc_before']:.3f} -> {r['acc_after']:.3f}" if r["acc_before"] is not None else "-"
        per_round = r.get("round_step_s")
        step_cell = f"{r['step_s']:.2f}" + (f" ({', '.join(f'{x:.2f}' for x in per_round)})" if per_round else "")
        steps_cell = f"{len(per_round)} x {r['steps']}" if per_round else f"{r['steps']}"
        lines.append(
            f"| {w.size} ({r['params'] / 1e6:.1f}M, {w.start}) | {r['runner']} | {r['dtype']} | {steps_cell} ({r['timed']}) "
            f"| {step_cell} | {r['tokens_per_s']:.0f} | {r['samples_per_s']:.1f} | {vs} "
            f"| {r['root_rss_gb']:.2f} | {r['tree_pss_gb']:.2f} | {acc} |")
    return "\n".join(lines)


def chart(rows: list[dict], out_png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(dict.fromkeys(r["size"] for r in rows))
    runners = list(dict.fromkeys((r["runner"], r["dtype"]) for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(runners)
    for i, (runner, dtype) in enumerate(runners):
        got = {r["size"]: r for r in rows if (r["runner"], r["dtype"]) == (runner, dtype)}
        xs = [j + i * width for j, s in enumerate(sizes) if s in got]
        label = f"{runner} {dtype}"
        axes[0].bar(xs, [got[s]["samples_per_s"] for s in sizes if s in got], width, label=label)
        axes[1].bar(xs, [got[s]["tree_pss_gb"] for s in sizes if s in got], width, label=label)
    for ax, label in zip(axes, ("samples per second (higher is better)", "peak memory, PSS of all processes (GB)"),
                         strict=True):
        ax.set_xticks([j + width * (len(runners) - 1) / 2 for j in range(len(sizes))], sizes)
        ax.set_xlabel("model size")
        ax.set_title(label, fontsize=10)
    axes[0].set_yscale("log")
    axes[0].legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1m and 10m, untrained, a few short steps (< 5 min)")
    parser.add_argument("--sizes", help="comma-separated tiny sizes (default 1m,10m,50m; 1m,10m with --quick; "
                        "10m,50m,400m,1b with --device cuda)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: one GPU, hybridrl on its local backend (default runners trl and "
                        "hybridrl-local-graphs, the GPU default; hybridrl-local pins eager decoding)")
    parser.add_argument("--runners", default=None, help=f"subset of {','.join(RUNNERS)}")
    parser.add_argument("--dtypes", default=None,
                        help="compute dtypes to run each framework in (TRL: bf16=True for bfloat16); default "
                        "float32,bfloat16, or float32 alone where the device emulates bf16")
    parser.add_argument("--workdir", default="runs/bench_grpo_vs_trl", help="data, models and per-run logs")
    parser.add_argument("--out", default=str(RESULTS / "grpo_vs_trl"), help="writes OUT.md and OUT.png (after "
                        "every run, so a run stopped part-way leaves the table so far)")
    parser.add_argument("--reuse", action="store_true",
                        help="take a run's row from WORKDIR/logs/RUNNER-SIZE-DTYPE.row.json where an earlier "
                        "invocation left one, instead of running it again (to split a benchmark over sessions)")
    parser.add_argument("--micro-batch", type=int, default=DEFAULT_MICRO_BATCH,
                        help="samples per forward/backward pass, both frameworks (hybridrl's "
                        "ppo_micro_batch_size_per_gpu and log_prob_micro_batch_size_per_gpu, TRL's "
                        "per_device_train_batch_size with gradient accumulation over the step's samples); it "
                        "must divide every size's prompts x samples. Fewer, larger passes cost less host work "
                        "per sample: what an update bound by launching work (a GPU's, at small models) waits on")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every framework this many times on each workload, alternating (trl, hybridrl, "
                        "trl, hybridrl, ...), and report medians over all rounds' timed steps: this machine's "
                        "speed drifts by 10-20%% within minutes, more than one run can average out")
    parser.add_argument("--run-one", choices=RUNNERS, help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {args.rounds}")
    if args.run_one:
        run_one(args.run_one, Workload(**json.loads(args.workload)), Path(args.result))
        return
    gpu = args.device == "cuda"
    default_sizes = "10m,50m,400m,1b" if gpu else ("1m,10m" if args.quick else "1m,10m,50m")
    sizes = (args.sizes or default_sizes).split(",")
    runners = (args.runners or ("trl,hybridrl-local-graphs" if gpu
                                else "trl,hybridrl-local,hybridrl-ray")).split(",")
    if not gpu and any(r.endswith(GRAPHS) for r in runners):
        raise SystemExit("--runners: hybridrl-local-graphs decodes with CUDA graphs; it needs --device cuda")
    if gpu:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no GPU")
    if gpu and args.out == str(RESULTS / "grpo_vs_trl"):
        args.out = str(RESULTS / "grpo_vs_trl_gpu")
    workdir = Path(args.workdir).resolve()
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    workloads = prepare(workdir, sizes, args.quick, args.device, args.micro_batch)
    rows = []
    for size_workload in workloads:
        for dtype in (args.dtypes or default_dtypes(args.device)).split(","):
            w = dataclasses.replace(size_workload, dtype=dtype)
            done: dict[str, list[dict]] = {}
            first = len(rows)
            for round_index in range(args.rounds):
                for runner in runners:  # the frameworks alternate on each workload, round after round
                    saved = workdir / "logs" / f"{runner}-{w.tag}.row.json"
                    if args.reuse and saved.exists():
                        if round_index == 0:
                            done[runner] = [json.loads(saved.read_text())]
                            print(f"{w.size:>4} {dtype:<9} {runner:<15} reused {saved}", flush=True)
                        continue
                    suffix = f"-round{round_index + 1}" if args.rounds > 1 else ""
                    row = measure(runner, w, workdir / "logs", suffix)
                    row["params"] = count_params(w.model)
                    done.setdefault(runner, []).append(row)
                    merged = merge_rounds(done[runner], w)
                    if round_index == args.rounds - 1:
                        saved.write_text(json.dumps(merged))
                    print(f"{w.size:>4} {dtype:<9} {runner:<15} {row['step_s']:7.2f} s/step "
                          f"{row['samples_per_s']:7.1f} samples/s (run took {row['wall_s']:.0f}s"
                          + (f", round {round_index + 1} of {args.rounds}" if args.rounds > 1 else "") + ")",
                          flush=True)
                    # the table so far, so that a run stopped part-way (a lease's time limit) still leaves one
                    rows[first:] = [merge_rounds(done[r], w) for r in runners if r in done]
                    text = write_report(rows, workloads, args)
            rows[first:] = [merge_rounds(done[r], w) for r in runners if r in done]
            text = write_report(rows, workloads, args)
    print(text)
    print(f"(benchmark took {(time.perf_counter() - started) / 60:.1f} min; table in {Path(args.out).with_suffix('.md')})")
    ratios = ratio_vs_trl(rows)
    if ratios:
        print("samples/s of hybridrl's faster backend over TRL's, per size: "
              + ", ".join(f"{size} {ratio:.2f}x ({runner})" for size, (ratio, runner) in ratios.items()))
        print(f"speedup vs TRL: {min(ratio for ratio, _ in ratios.values()):.2f}x")


def write_report(rows: list[dict], workloads: list[Workload], args: argparse.Namespace) -> str:
    """Write the table and its chart for `rows` at `--out` (.md and .png); return the table's text."""
    import torch

    gpu = args.device == "cuda"
    load = os.getloadavg()[0]
    header = (
        f"GRPO, hybridrl vs TRL {_version('trl')} GRPOTrainer on a {machine(args.device)} "
        f"(torch {torch.__version__}, transformers {_version('transformers')}, {torch.get_num_threads()} torch "
        f"threads per process by default, Ray workers 1 each), {'--quick, ' if args.quick else ''}"
        f"{time.strftime('%Y-%m-%d')}, 1-min load average at the end {load:.1f}. Per step: "
        + "; ".join(f"{w.size}: {w.prompts} prompts x {w.n} samples x {w.response_length} tokens" for w in workloads)
        + f", in forward/backward passes of {workloads[0].micro_batch} samples. Temperature 1.0, lr 5e-5, no KL, "
        "1 PPO epoch, 1 optimizer step per step, token-mean loss "
        "(TRL loss_type=dapo). dtype: the compute dtype (hybridrl: fsdp_config.mixed_precision.param_dtype and "
        "rollout.dtype, fp32 master weights; TRL: bf16=True, torch's autocast). s/step: median wall time from "
        "one optimizer step to the next (metrics and logging included), over the timed steps: those after the "
        "warm-up steps, less hybridrl's first and validated last step"
        + (f"; each framework ran {args.rounds} times on each workload, alternating with the others, and the "
           "medians are over every round's timed steps (each round's own median in brackets)" if args.rounds > 1 else "")
        + ". tokens/s counts response tokens. Both "
        "take the old log-probs from the update's forward pass on these fully on-policy steps (hybridrl: "
        "actor.fuse_old_log_prob). vs TRL's fastest: samples/s over TRL's faster dtype at that size."
    )
    text = table(rows, workloads, header)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text + "\n")
    chart(rows, out.with_suffix(".png"), f"GRPO on {machine(args.device) if gpu else f'{os.cpu_count()} CPU cores'}: "
          "hybridrl vs TRL")
    return text


def default_dtypes(device: str) -> str:
    """float32 and bfloat16 where `device` multiplies bf16 natively; float32 alone where it emulates bf16 (a
    CPU without AVX512_BF16 or AMX runs it many times slower than fp32: hybridrl/utils/device.py)."""
    from hybridrl.utils.device import native_bf16

    if native_bf16(device):
        return "float32,bfloat16"
    print(f"bfloat16 left out: this {device} emulates it (no AVX512_BF16 or AMX); naming it in the dtype flag "
          "runs it anyway", flush=True)
    return "float32"


def machine(device: str = "cpu") -> str:
    """This machine in a few words, for the tables' headers (Linux's /proc; the GPU's name on cuda)."""
    if device == "cuda":
        import torch

        props = torch.cuda.get_device_properties(0)
        return f"{props.name} ({props.total_memory / 2**30:.0f} GiB), torch {torch.__version__}"
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 "unknown CPU")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    isa = [name for flag, name in (("avx512f", "AVX-512"), ("avx512_bf16", "AVX512_BF16"), ("amx_tile", "AMX"))
           if flag in flags]
    if not isa and "avx2" in flags:  # the AVX2-only kind, which emulates bf16 (hybridrl/utils/device.py)
        isa = ["AVX2, no AVX-512"]
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()}-core {model}{' (' + ', '.join(isa) + ')' if isa else ''}, {memory_gb:.0f} GB RAM"


def publish(text: str, out: Path) -> None:
    """Write a benchmark's report to `out` (its folder made if need be) and print it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"(written to {out})")


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "(not installed)"


if __name__ == "__main__":
    main()
