"""Helpers for trainer tests: compose the PPO config, and the overrides of a few-second run."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "hybridrl" / "trainer" / "config")
FIXTURES = Path(__file__).parent / "fixtures"


def ppo_config(*overrides: str):
    import hybridrl.trainer.ppo_config  # noqa: F401 - registers the schema with Hydra's ConfigStore

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


def tiny_run_overrides(data: Path, model: Path, run_dir: Path) -> list[str]:
    """A few-second GRPO step: 4 prompts x 4 samples, 16 response tokens, a varied custom reward."""
    return [
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
        f"actor_rollout_ref.model.path={model}", "algorithm.adv_estimator=grpo",
        "data.train_batch_size=4", "data.max_response_length=16", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.optim.lr=1e-3",
        f"custom_reward_function.path={FIXTURES / 'digit_reward.py'}",
        f"trainer.default_local_dir={run_dir}", "trainer.logger=[console,file]", "trainer.test_freq=-1",
        "trainer.val_before_train=false",
    ]
