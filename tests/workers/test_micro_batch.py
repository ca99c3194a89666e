"""Micro-batching by token budget: cuts that cost least, budgets kept, every row once."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.workers.micro_batch import cheapest_cuts, make_micro_batches


def cost(sorted_lengths: list[int], cuts: list[tuple[int, int]]) -> int:
    """What cheapest_cuts minimises: each run is (rows + 1) x its longest length."""
    return sum((hi - lo + 1) * sorted_lengths[hi - 1] for lo, hi in cuts)


def all_cuts(n: int):
    for chosen in itertools.product([False, True], repeat=n - 1):
        bounds = [0, *[i + 1 for i, cut in enumerate(chosen) if cut], n]
        yield list(itertools.pairwise(bounds))


def test_short_answers_and_long_tool_calls_run_in_separate_passes():
    # 10 answers of 32 tokens and 22 tool conversations of 117: one pass pays 33 x 117 = 3861,
    # two pay 11 x 32 + 23 x 117 = 352 + 2691 = 3043
    lengths = [32] * 10 + [117] * 22
    cuts = cheapest_cuts(lengths, 4096)
    assert cuts == [(0, 10), (10, 32)]
    assert cost(lengths, cuts) == 3043


def test_close_lengths_stay_in_one_pass():
    # splitting 10 x 100 from 10 x 101 saves 10 padded tokens but costs a pass (a row): 21 x 101 = 2121 is least
    assert cheapest_cuts([100] * 10 + [101] * 10, 4096) == [(0, 20)]


def test_budget_is_kept_with_the_fewest_passes():
    cuts = cheapest_cuts([100] * 10, 450)  # 4 rows of 100 fit 450
    assert all((hi - lo) * 100 <= 450 for lo, hi in cuts)
    assert len(cuts) == 3 and cuts[0][0] == 0 and cuts[-1][1] == 10


@pytest.mark.parametrize("seed", range(20))
def test_matches_exhaustive_search_over_every_cut(seed):
    rng = random.Random(seed)
    lengths = sorted(rng.randint(1, 60) for _ in range(rng.randint(1, 9)))
    budget = rng.randint(max(lengths), 250)
    feasible = [c for c in all_cuts(len(lengths)) if all((hi - lo) * lengths[hi - 1] <= budget for lo, hi in c)]
    got = cheapest_cuts(lengths, budget)
    assert got in feasible
    assert cost(lengths, got) == min(cost(lengths, c) for c in feasible)


def right_padded(lengths: list[int], width: int) -> DataProto:
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])  # (rows, width)
    return DataProto.from_dict({"input_ids": torch.arange(len(lengths))[:, None].expand(-1, width).clone(),
                                "attention_mask": mask, "loss_mask": mask.clone()})


def test_dynamic_micro_batches_hold_every_row_once_within_the_budget():
    lengths = [5, 30, 6, 29, 7, 30, 4, 28]
    micro = make_micro_batches(right_padded(lengths, 32), max_token_len=64)
    rows = sorted(i for mb in micro for i in mb.indices)
    assert rows == list(range(len(lengths)))
    for mb in micro:
        assert len(mb.indices) * max(lengths[i] for i in mb.indices) <= 64
        assert mb.data.batch["input_ids"][:, 0].tolist() == mb.indices  # the rows are the indexed ones
    assert {tuple(sorted(lengths[i] for i in mb.indices)) for mb in micro} >= {(4, 5, 6, 7)}  # short ones together
