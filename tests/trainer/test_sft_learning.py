"""Slow learning test: the quickstart's SFT warm start (the YAML's defaults) teaches the 1M model the task,
and copies its imperfect teacher's slip.

Measured (1M Qwen2, lr 3e-3 cosine, 600 steps of 32, local backend, ~100 s on 2 idle cores): on the
default task SFT reaches 68.4% greedy on the 500 held-out problems (+ 97%, - 81%, * 27%); with the
quickstart's teacher, which drops the minus sign of 70% of the negative results it demonstrates, it
reaches 54.6%, and 65 of 100 held-out subtractions are wrong, most of them by the missing sign only.
"""

from __future__ import annotations

import json

import pytest
from learning import greedy_accuracy, greedy_answers

from hybridrl.data.sft_dataset import read_parquet_rows
from hybridrl.rewards.score.arithmetic import extract_answer

pytestmark = pytest.mark.slow


def test_sft_teaches_the_task_and_copies_the_teachers_slip(quickstart_sft):
    data, model_dir = quickstart_sft
    metrics = [json.loads(line) for line in (model_dir.parents[2] / "metrics.jsonl").read_text().splitlines()]
    losses = [m["train/loss"] for m in metrics if "train/loss" in m]
    assert sum(losses[-20:]) / 20 < 0.25 * sum(losses[:20]) / 20

    held_out = read_parquet_rows(data / "test.parquet")
    accuracy = greedy_accuracy(model_dir, held_out)
    print(f"held-out greedy accuracy after SFT: {accuracy:.3f}")
    assert 0.3 <= accuracy <= 0.8  # measured 0.546: a partial score, with room for RL above it

    negative = [r for r in held_out if int(r["reward_model"]["ground_truth"]) < 0]
    answers = [extract_answer(text) for text in greedy_answers(model_dir, negative)]
    truths = [r["reward_model"]["ground_truth"] for r in negative]
    signed = sum(a == t for a, t in zip(answers, truths, strict=True))
    unsigned = sum(a == t.lstrip("-") for a, t in zip(answers, truths, strict=True))
    print(f"negative results: {signed} right, {unsigned} right but for the sign, of {len(negative)}")
    assert unsigned > signed  # the teacher drops the sign 70% of the time; SFT imitates that
