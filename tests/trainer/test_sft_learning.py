"""Slow learning test: the quickstart's SFT warm start teaches the 1M model the column procedure and copies
its imperfect teacher's slip (the minus sign dropped from 70% of the negative results it demonstrates).

Measured with the quickstart's recipe (1200 SFT steps; `benchmarks/learning.py`) on an AMD EPYC, seeds
0-3: held-out greedy accuracy 0.724 / 0.708 / 0.742 / 0.650, addition 98-100% right (86% for seed 3),
final training loss 0.007-0.02; of the 122-132 negative held-out results none is right and 91-129 are
right but for the sign. 1 and 2 torch threads gave bit-identical models there. The bands below are
that spread with room: an SFT stopped before the procedure converged (the old 600-step recipe: loss
0.115, 41% of additions right on the same CPU) fails them.
"""

from __future__ import annotations

import json

import pytest
from learning import accuracy, greedy_answers, sign_slips

from hybridrl.data.sft_dataset import read_parquet_rows
from hybridrl.rewards.scorers import extract_answer

# The shared SFT fixture (1200 steps, ~3.5 min idle) runs inside the first test's setup; on a machine
# busy with other work it took over the suite's 600 s hang limit, so these tests get a longer one.
pytestmark = [pytest.mark.slow, pytest.mark.learning, pytest.mark.timeout(1800)]


def test_sft_teaches_the_task_and_copies_the_teachers_slip(quickstart_sft):
    data, model_dir = quickstart_sft
    metrics = [json.loads(line) for line in (model_dir.parents[2] / "metrics.jsonl").read_text().splitlines()]
    losses = [m["train/loss"] for m in metrics if "train/loss" in m]
    assert sum(losses[-20:]) / 20 < 0.05  # converged (measured 0.007-0.02; the 600-step recipe ended at 0.09-0.12)

    held_out = read_parquet_rows(data / "test.parquet")
    texts = greedy_answers(model_dir, held_out)
    sft_accuracy = accuracy(held_out, texts)
    print(f"held-out greedy accuracy after SFT: {sft_accuracy:.3f}")
    assert 0.6 <= sft_accuracy <= 0.8  # all but the negative results, where it copies the teacher's slip

    addition = [(r, t) for r, t in zip(held_out, texts, strict=True) if r["extra_info"]["operation"] == "+"]
    assert accuracy(*map(list, zip(*addition, strict=True))) >= 0.8  # the column procedure is learned

    negative = [(extract_answer(t), r["reward_model"]["ground_truth"]) for r, t in zip(held_out, texts, strict=True)
                if int(r["reward_model"]["ground_truth"]) < 0]
    signed = sum(answer == truth for answer, truth in negative)
    unsigned = sign_slips(held_out, texts)
    print(f"negative results: {signed} right, {unsigned} right but for the sign, of {len(negative)}")
    assert unsigned > 2 * signed  # the teacher drops the sign 70% of the time; SFT imitates that
