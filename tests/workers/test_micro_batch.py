"""Micro-batching by token budget: cuts that cost least, budgets kept, every row once."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from batches import rollout_batch

from hybridrl.protocol import DataProto
from hybridrl.workers.micro_batch import (
    MicroBatch,
    cheapest_cuts,
    make_micro_batches,
    restore_order,
    trim_columns,
)


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


# ----- device: what micro-batching makes follows its inputs' device -----------------------------------------
# There is no GPU here. Two stand-ins say where a tensor went instead: inputs on `meta` (shapes only; a CPU
# tensor made beside them shows up on the CPU, or fails to mix), and, for code that reads values, CPU inputs
# under `torch.device("meta")`, where every tensor made without naming a device lands on meta and fails the
# first time its values are read or it meets an input.
def test_restore_order_scatters_rows_back_on_the_parts_device():
    batches = [MicroBatch(right_padded([1, 1], 2), [2, 0]), MicroBatch(right_padded([1], 2), [1]),
               MicroBatch(right_padded([1], 2), [])]  # the last: a dummy pass, its output dropped
    parts = [torch.tensor([[20.0], [0.0]]), torch.tensor([[10.0]]), torch.tensor([[99.0]])]
    assert restore_order(parts, batches, 3).tolist() == [[0.0], [10.0], [20.0]]
    on_meta = restore_order([p.to("meta") for p in parts], batches, 3)
    assert on_meta.device.type == "meta" and on_meta.shape == (3, 1)


def test_micro_batching_makes_every_tensor_on_its_inputs_device():
    data = rollout_batch(rows=8)  # CPU tensors; width 22 = 10 prompt + 12 response columns
    with torch.device("meta"):
        fixed = make_micro_batches(data, micro_batch_size=3)
        dynamic = make_micro_batches(data, max_token_len=44)
        trimmed = [trim_columns(mb.data, response_length=12) for mb in fixed]
        restored = restore_order([mb.data.batch["responses"] for mb in fixed], fixed, len(data))
    devices = {t.device.type for mb in fixed + dynamic for t in mb.data.batch.values()}
    devices |= {t.device.type for tr in trimmed for t in (tr.input_ids, tr.attention_mask, tr.position_ids)}
    assert devices == {"cpu"}
    assert torch.equal(restored, data.batch["responses"])
