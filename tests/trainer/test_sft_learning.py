"""Slow learning test: SFT with the YAML's defaults on the default arithmetic task teaches the 1M model.

Measured with this trainer (`python -m hybridrl.trainer.main_sft` with the YAML's settings: 1M Qwen2, lr
3e-3 cosine, 600 steps of 32, default task, local backend, 106 s on the idle 2-core machine): validation
loss 0.050, 63.5% greedy accuracy on 200 held-out problems (+ 96%, - 69%, * 25%), 68.4% on all 500.
An earlier plain-loop run of the same recipe gave 41%: the task is learned abruptly late in training
(9% greedy after a 400-step run, 12% after 500), so the bounds below are loose on purpose: the point is
a partial score, which the quickstart's RL stage needs room above.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import hybridrl.trainer
from hybridrl.data.sft_dataset import read_parquet_rows
from hybridrl.data.tasks.arithmetic import main as make_arithmetic
from hybridrl.models.loading import load_causal_lm, load_tokenizer, padding_side
from hybridrl.models.tiny import build_tiny_model
from hybridrl.rewards.score import default_compute_score
from hybridrl.trainer.main_sft import run_sft

N_HELD_OUT = 200


def greedy_accuracy(model_dir: Path, rows: list[dict]) -> float:
    """Fraction of held-out problems whose greedy answer the arithmetic scorer accepts."""
    tokenizer, model = load_tokenizer(model_dir), load_causal_lm(model_dir).eval()
    scores = []
    with torch.no_grad(), padding_side(tokenizer, "left"):
        for start in range(0, len(rows), 100):
            chunk = rows[start:start + 100]
            texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
                     for r in chunk]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            # 96 new tokens: the longest worked response of the default task is ~50 tokens
            out = model.generate(**enc, max_new_tokens=96, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
            for row, ids in zip(chunk, out[:, enc["input_ids"].shape[1]:], strict=True):
                text = tokenizer.decode(ids, skip_special_tokens=True)
                scores.append(default_compute_score(row["data_source"], text, row["reward_model"]["ground_truth"]))
    return sum(scores) / len(scores)


@pytest.mark.slow
def test_sft_defaults_teach_the_tiny_model_arithmetic(tmp_path):
    make_arithmetic(["--out", str(tmp_path / "data")])  # the task's default flags, as the quickstart uses
    model_dir = build_tiny_model(tmp_path / "model", arch="qwen2", size="1m", seed=0)
    out = tmp_path / "sft"
    with initialize_config_dir(config_dir=str(Path(hybridrl.trainer.__file__).parent / "config"),
                               version_base=None):
        config = compose("sft_trainer", overrides=[
            f"data.train_files={tmp_path / 'data' / 'train.parquet'}",
            f"data.val_files={tmp_path / 'data' / 'test.parquet'}",
            f"model.partial_pretrain={model_dir}", f"trainer.default_local_dir={out}",
            "trainer.backend=local",  # same numbers as Ray (test_sft_trainer), without its start-up time
            "trainer.test_freq=50",
        ])
    run_sft(config)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = [m["val/loss"] for m in metrics if "val/loss" in m]
    assert val[-1] < 0.5 * val[0]
    hf_dir = next(out.glob("global_step_*/actor/huggingface"))
    held_out = read_parquet_rows(tmp_path / "data" / "test.parquet")[:N_HELD_OUT]
    accuracy = greedy_accuracy(hf_dir, held_out)
    print(f"held-out greedy accuracy after SFT: {accuracy:.3f}; validation loss {val[0]:.3f} -> {val[-1]:.3f}")
    # measured 0.41 (see the module docstring); clearly above chance (~0) and clearly below solved
    assert 0.15 <= accuracy <= 0.85
