"""Slow learning test: the quickstart's SFT warm start (the YAML's defaults) teaches the 1M model the task,
and copies its imperfect teacher's slip.

Measured (1M Qwen2, lr 3e-3 cosine, 600 steps of 32, local backend, ~100 s on 2 idle cores): on the
default task SFT reaches 68.4% greedy on the 500 held-out problems (+ 97%, - 81%, * 27%); with the
quickstart's teacher, which drops the minus sign of 70% of the negative results it demonstrates, it
reaches 52.2% (54.6% with one thread per process), and of the 84 negative held-out results none is
right and 59 are right but for the sign.
"""

from __future__ import annotations

import json

import pytest
from learning import accuracy, greedy_answers

from hybridrl.data.sft_dataset import read_parquet_rows
from hybridrl.rewards.score.arithmetic import extract_answer

pytestmark = pytest.mark.slow


def test_sft_teaches_the_task_and_copies_the_teachers_slip(quickstart_sft):
    data, model_dir = quickstart_sft
    metrics = [json.loads(line) for line in (model_dir.parents[2] / "metrics.jsonl").read_text().splitlines()]
    losses = [m["train/loss"] for m in metrics if "train/loss" in m]
    assert sum(losses[-20:]) / 20 < 0.25 * sum(losses[:20]) / 20

    held_out = read_parquet_rows(data / "test.parquet")
    texts = greedy_answers(model_dir, held_out)
    sft_accuracy = accuracy(held_out, texts)
    print(f"held-out greedy accuracy after SFT: {sft_accuracy:.3f}")
    assert 0.3 <= sft_accuracy <= 0.8  # measured 0.522-0.546: a partial score, with room for RL above it

    negative = [(extract_answer(t), r["reward_model"]["ground_truth"]) for r, t in zip(held_out, texts, strict=True)
                if int(r["reward_model"]["ground_truth"]) < 0]
    signed = sum(answer == truth for answer, truth in negative)
    unsigned = sum(answer == truth.lstrip("-") for answer, truth in negative)
    print(f"negative results: {signed} right, {unsigned} right but for the sign, of {len(negative)}")
    assert unsigned > signed  # the teacher drops the sign 70% of the time; SFT imitates that
