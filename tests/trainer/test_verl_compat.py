"""verl's GSM8K quickstart command runs unchanged apart from the module name, model path and data path.

The command below is verl's documented PPO quickstart (docs/start/quickstart), key for key. The test
writes a GSM8K-format dataset (the publisher's jsonl: question + answer ending in "#### n"), runs our
GSM8K preprocessor on it, substitutes a local tiny model (one that ends its answers within a few
tokens, see `early_stopping_model`) and the data paths, and adds only `trainer.total_training_steps=1`
so that the 15 epochs stop after one step.
"""

import json
import random
import subprocess
import sys

import pytest
from ppo_helpers import early_stopping_model, ppo_config

from hybridrl.trainer.main_ppo import run_ppo

# 256 prompts x up to 512 tokens through the real Ray pipeline: minutes on 2 cores, more when the machine is
# shared (it passed the 600 s default on a quiet CI machine and ran past it on one at load 6)
pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.usefixtures("ray_cluster"), pytest.mark.timeout(1500)]

VERL_QUICKSTART = ["data.train_files=$HOME/data/gsm8k/train.parquet", "data.val_files=$HOME/data/gsm8k/test.parquet", "data.train_batch_size=256", "data.max_prompt_length=512", "data.max_response_length=512", "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct", "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.ppo_mini_batch_size=64", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8", "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.gpu_memory_utilization=0.4", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "critic.optim.lr=1e-5", "critic.model.path=Qwen/Qwen2.5-0.5B-Instruct", "critic.ppo_micro_batch_size_per_gpu=4", "algorithm.kl_ctrl.kl_coef=0.001", "trainer.logger=console", "trainer.val_before_train=False", "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.save_freq=10", "trainer.test_freq=10", "trainer.total_epochs=15"]


def write_gsm8k_jsonl(path, rows: int, seed: int) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(rows):
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            f.write(json.dumps({
                "question": f"Ann has {a} marbles and finds {b} more. How many marbles does she have now?",
                "answer": f"She has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} marbles.\n#### {a + b}",
            }) + "\n")


def test_verl_quickstart_command_runs_a_step(tmp_path):
    # Untrained tiny models rarely emit EOS, and 256 x 512-token responses take many minutes on CPU.
    model_dir = early_stopping_model(tmp_path / "model")
    raw = tmp_path / "raw"
    raw.mkdir()
    write_gsm8k_jsonl(raw / "train.jsonl", 256, seed=0)
    write_gsm8k_jsonl(raw / "test.jsonl", 8, seed=1)
    data = tmp_path / "gsm8k"
    subprocess.run([sys.executable, "-m", "hybridrl.data.tasks.gsm8k", "--input", str(raw), "--out", str(data)],
                   check=True, capture_output=True)
    replaced = {
        "data.train_files": data / "train.parquet", "data.val_files": data / "test.parquet",
        "actor_rollout_ref.model.path": model_dir, "critic.model.path": model_dir,
    }
    overrides = [f"{k}={replaced[k]}" if (k := arg.split("=")[0]) in replaced else arg for arg in VERL_QUICKSTART]
    history = run_ppo(ppo_config(*overrides, "trainer.total_training_steps=1",
                                 f"trainer.default_local_dir={tmp_path / 'run'}"))
    step = history[-1]
    assert step["training/global_step"] == 1
    assert {"critic/vf_loss", "critic/values/mean", "actor/pg_loss", "critic/score/mean"} <= set(step)
    assert "val-core/openai/gsm8k/reward/mean@1" in step  # the last step validates
