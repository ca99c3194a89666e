"""verl's rearrange_micro_batches (compat/verl_seqlen_balancing.py): micro-batches within a token budget,
their counts by hand, and one count agreed across data-parallel ranks."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from verl_seqlen_balancing import get_reverse_idx, rearrange_micro_batches

from hybridrl.protocol import DataProto


def left_padded_batch(lengths, width):
    """input_ids with each row's values unique (row*1000 + position) and left padding."""
    n = len(lengths)
    mask = torch.zeros(n, width, dtype=torch.long)  # (batch, width)
    for row, length in enumerate(lengths):
        mask[row, width - length :] = 1
    ids = (torch.arange(n)[:, None] * 1000 + torch.arange(width)[None, :]) * mask  # (batch, width)
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("seed", range(4))
def test_micro_batches_respect_budget_and_restore_order(seed):
    lengths = [random.Random(seed).randint(1, 100) for _ in range(40)]
    batch = left_padded_batch(lengths, 100)
    budget = 300
    micro, idx = rearrange_micro_batches(batch, max_token_len=budget)
    assert len(micro) >= -(-sum(lengths) // budget)  # never fewer than the total needs
    assert sorted(i for p in idx for i in p) == list(range(40))
    for mb, rows in zip(micro, idx, strict=True):
        assert int(mb["attention_mask"].sum()) <= budget
        assert torch.equal(mb["input_ids"], batch["input_ids"][rows])
    # a per-row output computed micro-batch by micro-batch comes back in the original order
    outputs = torch.cat([mb["input_ids"].sum(-1) for mb in micro])  # (batch,)
    flat = [i for p in idx for i in p]
    restored = outputs[torch.tensor(get_reverse_idx(flat))]
    assert torch.equal(restored, batch["input_ids"].sum(-1))


def test_micro_batch_counts_by_hand():
    # total 40 tokens, budget 10 -> at least 4 micro-batches; [9,1,9,1,...] pairs exactly
    batch = left_padded_batch([9, 1, 9, 1, 9, 1, 9, 1], 10)
    micro, idx = rearrange_micro_batches(batch, max_token_len=10)
    assert len(micro) == 4 and all(int(m["attention_mask"].sum()) == 10 for m in micro)
    # rounding up to a multiple of 3 gives 6; asking for at least 5 gives 5
    assert len(rearrange_micro_batches(batch, 10, num_batches_divided_by=3)[0]) == 6
    assert len(rearrange_micro_batches(batch, 10, min_num_micro_batch=5)[0]) == 5
    with pytest.raises(ValueError, match="ppo_max_token_len_per_gpu"):
        rearrange_micro_batches(batch, max_token_len=8)


def test_get_reverse_idx_by_hand():
    # outputs produced for rows [2, 0, 1]: row 0 sits at position 1, row 1 at 2, row 2 at 0
    assert get_reverse_idx([2, 0, 1]) == [1, 2, 0]


def test_works_on_dataproto():
    batch = left_padded_batch([3, 5, 2, 6], 6)
    data = DataProto.from_single_dict({**batch, "uid": np.array(list("abcd"), dtype=object)})
    micro, idx = rearrange_micro_batches(data, max_token_len=8)
    for mb, rows in zip(micro, idx, strict=True):
        assert list(mb.non_tensor_batch["uid"]) == ["abcd"[r] for r in rows]
        assert int(mb.batch["attention_mask"].sum()) <= 8


def _dp_worker(rank: int, init_file: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        # rank 0 fits its 4 x 5 tokens in 2 micro-batches of 10; rank 1 needs 4 for 4 x 9 tokens
        lengths = [5, 5, 5, 5] if rank == 0 else [9, 9, 9, 9]
        micro, _ = rearrange_micro_batches(left_padded_batch(lengths, 10), 10, dp_group=dist.group.WORLD)
        results[rank] = len(micro)
    finally:
        dist.destroy_process_group()


def test_same_micro_batch_count_across_dp_ranks(tmp_path):
    results = mp.Manager().dict()
    mp.spawn(_dp_worker, args=(str(tmp_path / "init"), results), nprocs=2, join=True)
    assert dict(results) == {0: 4, 1: 4}
