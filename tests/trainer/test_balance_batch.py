"""balance_batch: ranks get similar token counts; with keep_groups each prompt's rows stay on one rank."""

import numpy as np
import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer import dataflow


def _batch(group_lengths: list[list[int]], width: int = 20) -> DataProto:
    """One row per length, its uid the group's; each row's attention mask has `length` ones."""
    lengths = [n for group in group_lengths for n in group]
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    uids = np.array([f"g{g}" for g, group in enumerate(group_lengths) for _ in group], dtype=object)
    return DataProto.from_dict({"attention_mask": mask, "row": torch.arange(len(lengths))}, {"uid": uids})


def _chunk_uids_and_tokens(batch: DataProto, world_size: int):
    return [(set(part.non_tensor_batch["uid"]), int(part.batch["attention_mask"].sum()))
            for part in batch.chunk(world_size)]


def test_whole_groups_go_to_one_rank_and_the_tokens_balance():
    # group token totals 40, 36, 12, 10, 8, 6: three groups each, 40+10+6 = 36+12+8 = 56
    groups = [[10, 10, 10, 10], [9, 9, 9, 9], [3, 3, 3, 3], [4, 2, 2, 2], [2, 2, 2, 2], [1, 1, 2, 2]]
    batch = _batch(groups)
    dataflow.balance_batch(batch, world_size=2, keep_groups=True)
    chunks = _chunk_uids_and_tokens(batch, 2)
    assert chunks[0][0].isdisjoint(chunks[1][0]) and len(chunks[0][0]) == len(chunks[1][0]) == 3
    assert [tokens for _, tokens in chunks] == [56, 56]
    assert sorted(batch.batch["row"].tolist()) == list(range(24))  # every row once


def test_rows_are_balanced_one_by_one_when_groups_cannot_split_evenly():
    batch = _batch([[10, 10, 10, 10], [9, 9, 9, 9], [3, 3, 3, 3]])  # 3 groups over 2 ranks
    dataflow.balance_batch(batch, world_size=2, keep_groups=True)
    chunks = _chunk_uids_and_tokens(batch, 2)
    assert abs(chunks[0][1] - chunks[1][1]) <= 2
    assert not chunks[0][0].isdisjoint(chunks[1][0])  # some prompt's rows are on both ranks
