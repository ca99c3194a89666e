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
        # CPU on any machine, so a GPU machine runs the same tests; the gpu-marked ones add trainer.device=cuda
        # after these (the later override wins).
        "trainer.device=cpu",
    ]


def early_stopping_model(out_dir: Path, eos_pull: float = 8.0) -> Path:
    """A tiny model whose answers end after a few tokens (2-30 for eos_pull=8), so long-response configs run
    quickly: the 1m model with EOS pulled up (`hybridrl.models.tiny.pull_eos_up`)."""
    from hybridrl.models.tiny import build_tiny_model, pull_eos_up

    return pull_eos_up(build_tiny_model(out_dir, arch="qwen2", size="1m", seed=0), eos_pull)


def random_reward_model(model_dir: Path, out_dir: Path) -> Path:
    """A reward model from the tiny model with a random score head (seeded): scores that vary by response."""
    import torch

    from hybridrl.models.loading import load_tokenizer, load_value_model

    model = load_value_model(model_dir)
    with torch.no_grad():
        model.score.weight.copy_(torch.randn(model.score.weight.shape, generator=torch.Generator().manual_seed(1)))
    model.save_pretrained(out_dir)
    load_tokenizer(model_dir).save_pretrained(out_dir)
    return out_dir


def scored_batch(scores, masks, uids):
    """A DataProto of token_level_rewards (each row's score on its last valid token), response_mask and uid."""
    import numpy as np
    import torch

    from hybridrl.protocol import DataProto

    mask = torch.tensor(masks, dtype=torch.long)
    rewards = torch.zeros(mask.shape)
    for row, score in enumerate(scores):
        valid = mask[row].nonzero()
        if len(valid):
            rewards[row, valid[-1]] = score
    return DataProto.from_dict({"token_level_rewards": rewards, "response_mask": mask},
                               {"uid": np.array(uids, dtype=object)})
