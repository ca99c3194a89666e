"""The main job: GRPO on the built-in arithmetic task, end to end on a CPU laptop.

`python -m hybridrl.quickstart` runs the whole path in `--workdir` (default `runs/quickstart`):

1. writes the arithmetic task (train/test parquet in verl's schema), whose SFT demonstrations come from
   an imperfect teacher that often forgets the minus sign of a negative result;
2. builds a ~1M-parameter Qwen2-style model and tokenizer offline;
3. warm-starts it with SFT on the worked answers (cached: a second run reuses it), which copies the slip;
4. trains it with GRPO, 2 worker processes under Ray, validating on held-out problems: the reward checks
   the exact result, so the model learns to do better than its teacher;
5. prints a summary (held-out accuracy before and after, time per step) and writes `curves.png`.

Every stage is the project's ordinary entry point, driven through its Hydra config.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

CONFIG_DIR = str(Path(__file__).parent / "trainer" / "config")
ACCURACY_KEY = "val-core/arithmetic/reward/mean@1"


def _compose(config_name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=config_name, overrides=overrides)


# The task's flags. The teacher whose worked answers SFT imitates drops the minus sign of 70% of the
# negative results (see hybridrl.data.tasks.arithmetic.teacher_slips): SFT copies the slip, GRPO's
# exact-answer reward removes it, and the held-out accuracy shows the difference.
TASK_ARGS = ["--teacher-sign-error", "0.7"]


def prepare_data(workdir: Path) -> Path:
    """Write the task once; different task flags (an older quickstart) rewrite it and drop the stale SFT."""
    data = workdir / "data"
    stamp = data / "task_args.json"
    if not (data / "train.parquet").exists() or not stamp.exists() or json.loads(stamp.read_text()) != TASK_ARGS:
        shutil.rmtree(workdir / "sft", ignore_errors=True)
        subprocess.run([sys.executable, "-m", "hybridrl.data.tasks.arithmetic", "--out", str(data), *TASK_ARGS],
                       check=True)
        stamp.write_text(json.dumps(TASK_ARGS))
    return data


def prepare_base_model(workdir: Path) -> Path:
    from hybridrl.models.tiny import build_tiny_model

    base = workdir / "base_model"
    if not (base / "config.json").exists():
        build_tiny_model(base, arch="qwen2", size="1m", seed=0)
    return base


def warm_start(workdir: Path, data: Path, base: Path) -> Path:
    """SFT on the worked answers; a finished earlier run is reused (resume_mode=auto finds it)."""
    from hybridrl.trainer.main_sft import run_sft
    from hybridrl.workers.checkpoint import find_latest_ckpt_path

    sft_dir = workdir / "sft"
    latest = find_latest_ckpt_path(sft_dir)
    if latest is None or not (Path(latest) / "actor" / "huggingface" / "config.json").exists():
        start = time.perf_counter()
        run_sft(_compose("sft_trainer", [
            f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
            f"model.partial_pretrain={base}", f"trainer.default_local_dir={sft_dir}", "trainer.backend=local",
        ]))
        print(f"SFT warm start took {time.perf_counter() - start:.0f}s")
        latest = find_latest_ckpt_path(sft_dir)
    return Path(latest) / "actor" / "huggingface"


def train_grpo(workdir: Path, data: Path, model: Path, steps: int, extra: list[str]) -> list[dict]:
    from hybridrl.trainer.main_ppo import run_ppo

    run_dir = workdir / "grpo"
    shutil.rmtree(run_dir, ignore_errors=True)  # each quickstart run trains afresh from the SFT model
    return run_ppo(_compose("ppo_trainer", [
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
        f"actor_rollout_ref.model.path={model}", "algorithm.adv_estimator=grpo",
        f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={run_dir}",
        "trainer.resume_mode=disable", *extra,
    ]))


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="GRPO quickstart on the built-in arithmetic task (CPU).")
    parser.add_argument("--workdir", default="runs/quickstart", help="where data, models and logs go")
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for the GRPO run (key=value)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir).expanduser().resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    data = prepare_data(workdir)
    model = warm_start(workdir, data, prepare_base_model(workdir))
    history = train_grpo(workdir, data, model, args.steps, args.overrides)
    summary = summarize(history, workdir / "curves.png")
    summary["total minutes"] = round((time.perf_counter() - start) / 60, 1)
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    print("\n=== quickstart summary ===")
    for key, value in summary.items():
        print(f"  {key:<28} {value:.3f}" if isinstance(value, float) else f"  {key:<28} {value}")
    print(f"  curves                       {workdir / 'curves.png'}")


if __name__ == "__main__":
    main()
