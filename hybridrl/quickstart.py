"""The main job: GRPO on the built-in arithmetic task, end to end on a CPU laptop (docs/getting-started.md).
Task data, a tiny model, an SFT warm start on an imperfect teacher's answers, GRPO under Ray, a summary: each
stage is the project's ordinary entry point, driven through its Hydra config.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from hydra import compose, initialize_config_dir

CONFIG_DIR = str(Path(__file__).parent / "trainer" / "config")
ACCURACY_KEY = "val-core/arithmetic/reward/mean@1"
# the compute dtypes set to bf16 on a CPU that multiplies it natively (master weights stay fp32)
PRECISION_KEYS = ("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype", "actor_rollout_ref.rollout.dtype")


def _compose(config_name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=config_name, overrides=overrides)


# 2-digit + and - whose SFT teacher drops the minus sign of 70% of negative results (teacher_slips), which
# GRPO's exact-answer reward removes; a 1M model learns * only partly, leaving noise a reward cannot fix
TASK_ARGS = ["--ops", "+,-", "--teacher-sign-error", "0.7"]
MODEL_SIZE = "1m"
# enough steps for SFT to learn the column procedure on every CPU and seed (benchmarks/results/learning.md)
# SFT of the tiny model from scratch on top of sft_trainer.yaml, whose defaults are verl's (for a pretrained model)
SFT_OVERRIDES = ["optim.lr=3e-3", "optim.betas=[0.9,0.999]", "optim.lr_warmup_steps_ratio=0.05", "data.max_length=128",
                 "data.train_batch_size=32", "data.micro_batch_size_per_gpu=32", "trainer.total_epochs=1",
                 "trainer.total_training_steps=1200", "trainer.max_ckpt_to_keep=1"]
# GRPO's group and validation cadence on top of ppo_trainer.yaml, whose other keys follow verl's defaults; the
# critic's rate (read only by algorithm.adv_estimator=gae) fits a fresh value head on the tiny model
GRPO_RECIPE = ["actor_rollout_ref.rollout.n=8", "trainer.test_freq=10", "critic.optim.lr=1e-4"]


def _stamp(path: Path, settings: dict) -> bool:
    """True when `path` holds exactly `settings` (what an earlier run made its outputs with)."""
    return path.exists() and json.loads(path.read_text()) == settings


def prepare_data(workdir: Path, seed: int = 0) -> Path:
    """Write the task once; other task flags or seed (an older quickstart) rewrite it and drop the stale SFT."""
    data = workdir / "data"
    settings = {"task_args": TASK_ARGS, "seed": seed}
    if not (data / "train.parquet").exists() or not _stamp(data / "task_args.json", settings):
        shutil.rmtree(workdir / "sft", ignore_errors=True)
        subprocess.run([sys.executable, "-m", "hybridrl.data.tasks.arithmetic", "--out", str(data),
                        "--seed", str(seed), *TASK_ARGS], check=True)
        (data / "task_args.json").write_text(json.dumps(settings))
    return data


def prepare_base_model(workdir: Path, seed: int = 0) -> Path:
    from hybridrl.models.tiny import build_tiny_model

    base = workdir / "base_model"
    settings = {"size": MODEL_SIZE, "seed": seed}
    if not (base / "config.json").exists() or not _stamp(base / "quickstart.json", settings):
        shutil.rmtree(workdir / "sft", ignore_errors=True)
        build_tiny_model(base, arch="qwen2", size=MODEL_SIZE, seed=seed)
        (base / "quickstart.json").write_text(json.dumps(settings))
    return base


def warm_start(workdir: Path, data: Path, base: Path, seed: int = 0, overrides: list[str] = SFT_OVERRIDES,
               train_file: str = "train.parquet", val_file: str | None = "test.parquet") -> Path:
    """SFT on the worked answers (`data/train_file`, `overrides` on top of sft_trainer.yaml); a finished
    earlier run with the same settings is reused."""
    from hybridrl.trainer.main_sft import run_sft

    sft_dir = workdir / "sft"
    settings = {"overrides": overrides, "seed": seed}
    model = latest_hf_model(sft_dir)
    if model is None or not _stamp(sft_dir / "quickstart.json", settings):
        shutil.rmtree(sft_dir, ignore_errors=True)
        start = time.perf_counter()
        files = [f"data.train_files={data / train_file}"] + ([f"data.val_files={data / val_file}"] if val_file else [])
        run_sft(_compose("sft_trainer", [
            *files, f"model.partial_pretrain={base}", f"trainer.default_local_dir={sft_dir}", "trainer.backend=local",
            f"trainer.seed={seed}", "trainer.logger=[file]", *overrides,
        ]))
        (sft_dir / "quickstart.json").write_text(json.dumps(settings))
        print(f"SFT warm start took {time.perf_counter() - start:.0f}s (log: {sft_dir / 'metrics.jsonl'})")
        model = latest_hf_model(sft_dir)
    return model


def train_grpo(workdir: Path, data: Path, model: Path, steps: int, extra: list[str], seed: int = 0) -> list[dict]:
    from hybridrl.trainer.main_ppo import run_ppo

    run_dir = workdir / "grpo"
    shutil.rmtree(run_dir, ignore_errors=True)  # each quickstart run trains afresh from the SFT model
    return run_ppo(_compose("ppo_trainer", [
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
        f"actor_rollout_ref.model.path={model}", "algorithm.adv_estimator=grpo", f"data.seed={seed}",
        *GRPO_RECIPE, f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={run_dir}",
        "trainer.resume_mode=disable", "trainer.logger=[file]",
        # the last step's model as a plain Hugging Face directory: grpo/global_step_N/actor/huggingface
        f"trainer.save_freq={steps}", "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]", *extra,
    ]))


def latest_hf_model(run_dir: Path) -> Path | None:
    """The Hugging Face model directory of `run_dir`'s latest committed checkpoint, if it holds one."""
    from hybridrl.workers.checkpoint_resume import find_latest_ckpt_path

    latest = find_latest_ckpt_path(run_dir)
    model = None if latest is None else Path(latest) / "actor" / "huggingface"
    return model if model is not None and (model / "config.json").exists() else None


def summarize(history: list[dict], out_png: Path) -> dict:
    validations = [(m["training/global_step"], m[ACCURACY_KEY]) for m in history if ACCURACY_KEY in m]
    steps = [m for m in history if "timing_s/step" in m]
    summary = {
        "held-out accuracy before": validations[0][1] if validations else None,
        "held-out accuracy after": validations[-1][1] if validations else None,
        "training steps": len(steps),
        "seconds per step (median)": sorted(m["timing_s/step"] for m in steps)[len(steps) // 2] if steps else None,
    }
    _plot(steps, validations, out_png)
    return summary


def _plot(steps: list[dict], validations: list[tuple[int, float]], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([m["training/global_step"] for m in steps], [m["critic/score/mean"] for m in steps],
            label="training score (mean over samples)")
    if validations:
        ax.plot(*zip(*validations, strict=True), marker="o", label="held-out greedy accuracy")
    ax.set_xlabel("GRPO step")
    ax.set_ylim(0, 1)
    ax.set_title("hybridrl quickstart: GRPO on arithmetic (tiny model, CPU)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def with_threads(threads: int | None, grpo_overrides: list[str]) -> list[str]:
    """Give each GRPO worker `threads` CPUs (this process's own count is `torch_threads`'s job)."""
    if threads is not None:
        grpo_overrides.insert(0, f"ray_init.cpus_per_worker={threads}")
    return grpo_overrides


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Compute with `threads` torch threads in this process (SFT, and a local-backend GRPO, run here) and
    give the caller its own count back: a notebook or test that calls `main` keeps its threads."""
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def precision_overrides(extra: list[str]) -> list[str]:
    """bf16 compute where the run's device is a CPU that multiplies it natively (AMX, AVX512_BF16: faster, and
    it still learns: benchmarks/results/learning_bf16.md); elsewhere the default `auto` decides."""
    from hybridrl.utils.device import native_bf16, resolve_device_type

    device = next((o.split("=", 1)[1] for o in reversed(extra) if o.startswith("trainer.device=")), "auto")
    if resolve_device_type(device) != "cpu" or not native_bf16("cpu"):
        return []
    return [f"{key}=bfloat16" for key in PRECISION_KEYS]


def grpo_run_overrides(threads: int | None, extra: list[str]) -> list[str]:
    """`precision_overrides`, then the command line's (which win), with `threads`; `trainer.backend=local`
    (one rank in this process) brings `trainer.n_gpus_per_node=1` unless the command line names a count."""
    one_rank = (["trainer.n_gpus_per_node=1"] if "trainer.backend=local" in extra
                and not any(o.startswith("trainer.n_gpus_per_node=") for o in extra) else [])
    return with_threads(threads, [*precision_overrides(extra), *one_rank, *extra])


def sft_run_overrides(extra: list[str]) -> list[str]:
    """SFT's recipe plus the command line's `trainer.device`: the warm start computes where GRPO does."""
    return [*SFT_OVERRIDES, *(o for o in extra if o.startswith("trainer.device="))]


def write_summary(workdir: Path, summary: dict, start: float, title: str) -> None:
    """Add the run's minutes and trained model to `summary`, write it to `workdir/summary.json`, print it."""
    summary["total minutes"] = round((time.perf_counter() - start) / 60, 1)
    summary["trained model"] = str(latest_hf_model(workdir / "grpo"))
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    width = max(len(key) for key in summary) + 2
    print(f"\n=== {title} summary ===")
    for key, value in summary.items():
        print(f"  {key:<{width}} {value:.3f}" if isinstance(value, float) else f"  {key:<{width}} {value}")
    print(f"  {'curves':<{width}} {workdir / 'curves.png'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="GRPO quickstart on the built-in arithmetic task (CPU).")
    parser.add_argument("--workdir", default="runs/quickstart", help="where data, models and logs go")
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps")
    parser.add_argument("--seed", type=int, default=0, help="seed of the task data, the model's init and SFT's data order")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per process: SFT's, and each GRPO worker's CPUs (default: SFT uses every "
                             "core, each of the 2 GRPO workers one)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for the GRPO run (key=value)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir).expanduser().resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    grpo_overrides = grpo_run_overrides(args.threads, args.overrides)
    start = time.perf_counter()
    with torch_threads(args.threads):
        print("[1/4] task data and [2/4] tiny model", flush=True)
        data = prepare_data(workdir, args.seed)
        base = prepare_base_model(workdir, args.seed)
        print("[3/4] SFT warm start on the teacher's worked answers", flush=True)
        model = warm_start(workdir, data, base, args.seed, sft_run_overrides(args.overrides))
        print(f"[4/4] GRPO, {args.steps} steps, held-out greedy accuracy every 10 (log: {workdir / 'grpo'})",
              flush=True)
        history = train_grpo(workdir, data, model, args.steps, grpo_overrides, args.seed)
    write_summary(workdir, summarize(history, workdir / "curves.png"), start, "quickstart")


if __name__ == "__main__":
    main()
