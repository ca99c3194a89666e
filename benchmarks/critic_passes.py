"""PPO with a critic (GAE): the critic's passes with each shared prompt computed once, against padded.

Runs the slow learning test's GAE recipe (tests/trainer/test_rl_learning.py: the quickstart's settings,
5 critic warm-up steps) for a few steps from the quickstart's SFT model, with
`critic.model.share_prompt_forward=true` and `false` alternating, and prints the median seconds of the
critic's value pass, its update and the whole step (steps after the first two), per backend.

    python benchmarks/critic_passes.py --workdir runs/critic_passes [--rounds 2] [--steps 10]

writes benchmarks/results/critic_passes.md (`--out` elsewhere).
The quickstart's data and SFT model are made in the work directory the first time (~3 minutes) and
reused after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_vs_trl import machine, publish  # noqa: E402  (a sibling script, not a package)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "critic_passes.md"
TIMINGS = ("timing_s/values", "timing_s/update_critic", "timing_s/step")
BACKENDS = {"ray (2 workers x 1 thread)": [], "local (1 process x 2 threads)": ["trainer.backend=local",
                                                                              "trainer.n_gpus_per_node=1"]}


def gae_run(data: Path, model: Path, steps: int, share: bool, extra: list[str]) -> dict[str, float]:
    """Median seconds of each timing over the run's steps after the first two."""
    from hydra import compose, initialize_config_dir

    import hybridrl.trainer.ppo_config  # noqa: F401 - registers the config schema
    from hybridrl.quickstart import GRPO_RECIPE, precision_overrides
    from hybridrl.trainer.main_ppo import run_ppo

    run_dir = Path(tempfile.mkdtemp(prefix="critic_passes_"))
    overrides = [
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
        f"actor_rollout_ref.model.path={model}", "algorithm.adv_estimator=gae", "data.seed=0", *GRPO_RECIPE,
        f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={run_dir}",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[file]",
        *precision_overrides(extra), "trainer.critic_warmup=5", f"critic.model.share_prompt_forward={str(share).lower()}", *extra,
    ]
    with initialize_config_dir(config_dir=str(REPO / "hybridrl" / "trainer" / "config"), version_base=None):
        run_ppo(compose(config_name="ppo_trainer", overrides=overrides))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][2:]
    return {name: statistics.median(row[name] for row in rows) for name in TIMINGS}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/critic_passes")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each setting per backend, alternating")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    from hybridrl import quickstart

    workdir = Path(args.workdir)
    data = quickstart.prepare_data(workdir)
    model = quickstart.warm_start(workdir, data, quickstart.prepare_base_model(workdir))
    command = "python benchmarks/critic_passes.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = ["# The critic's passes with shared prompts", "",
             f"GAE runs of the learning test's recipe (the quickstart's settings: actor and rollout in bf16 where "
             f"the CPU multiplies it natively, critic fp32; 5 critic warm-up steps), {args.steps} steps from the "
             f"quickstart's seed-0 SFT model; seconds, medians over steps 3-{args.steps} and then over {args.rounds} "
             f"runs of each setting, alternating. {machine()}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. "
             f"Command: `{command.strip()}`.", "",
             "| backend | pass | padded s | shared s | padded / shared |", "|---|---|---:|---:|---:|"]
    for backend, extra in BACKENDS.items():
        runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        for _ in range(args.rounds):
            for share in (True, False):
                runs[share].append(gae_run(data, model, args.steps, share, extra))
        for name in TIMINGS:
            padded = statistics.median(run[name] for run in runs[False])
            shared = statistics.median(run[name] for run in runs[True])
            lines.append(f"| {backend} | {name.split('/')[-1]} | {padded:.3f} | {shared:.3f} | {padded / shared:.2f}x |")
    publish("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
