"""The resumable sampler: a resumed run sees exactly the prompts an uninterrupted run would have."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridrl.data.rl_dataset import RLHFDataset, collate_fn
from hybridrl.data.sampler import ResumableSampler, StatefulDataLoader, create_rl_sampler
from hybridrl.data.tasks.sources import make_row


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, tiny_tokenizer):
    path = tmp_path_factory.mktemp("prompts") / "train.parquet"
    table = [
        make_row(data_source="arithmetic", question=f"{i}+{i}", ground_truth=str(2 * i), answer="", split="train",
                 index=i)
        for i in range(10)
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(table), path)
    return RLHFDataset(path, tiny_tokenizer, {"max_prompt_length": 24})


def make_loader(dataset, batch_size, drop_last, num_workers=0, seed=7):
    sampler = ResumableSampler(len(dataset), shuffle=True, seed=seed)
    return StatefulDataLoader(dataset, sampler=sampler, batch_size=batch_size, drop_last=drop_last,
                              collate_fn=collate_fn, num_workers=num_workers)  # fmt: skip


def take(loader, n_batches):
    """What a trainer's epoch loop consumes: batches in order, epoch after epoch, until n_batches."""
    seen = []
    while len(seen) < n_batches:
        for batch in loader:
            seen.append(list(batch["index"]))
            if len(seen) == n_batches:
                break
    return seen


def test_order_is_seeded_per_epoch():
    s = ResumableSampler(10, seed=3)
    assert s.order(0) == ResumableSampler(10, seed=3).order(0)
    assert sorted(s.order(0)) == list(range(10))
    assert s.order(0) != s.order(1)  # reshuffled every epoch
    assert s.order(0) != ResumableSampler(10, seed=4).order(0)
    assert ResumableSampler(4, shuffle=False).order(5) == [0, 1, 2, 3]
    first = list(s)
    assert first == s.order(0) and s.state_dict()["epoch"] == 1 and list(s) == s.order(1)


# 10 prompts in batches of 3: drop_last=True gives 3 batches per epoch, False gives 4 (the last of 1)
@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("stop_after", [1, 3, 4, 5, 7])  # mid-epoch, at or near the epoch boundary, epoch 2
def test_resume_sees_the_same_prompts(dataset, drop_last, stop_after):
    total = 10
    uninterrupted = take(make_loader(dataset, 3, drop_last), total)
    first = make_loader(dataset, 3, drop_last)
    before = take(first, stop_after)
    state = first.state_dict()
    resumed = make_loader(dataset, 3, drop_last)  # a fresh process: new sampler, new loader
    resumed.load_state_dict(state)
    after = take(resumed, total - stop_after)
    assert before + after == uninterrupted
    per_epoch = 3 if drop_last else 4
    for epoch in range(2):  # no prompt twice within an epoch
        seen = [i for b in uninterrupted[epoch * per_epoch : (epoch + 1) * per_epoch] for i in b]
        assert len(seen) == len(set(seen)) == (9 if drop_last else 10)


def test_resume_is_exact_despite_worker_prefetch(dataset):
    uninterrupted = take(make_loader(dataset, 2, True), 8)
    first = make_loader(dataset, 2, True, num_workers=1)
    before = take(first, 2)
    state = first.state_dict()
    # the worker prefetched batches the trainer never saw; the sampler alone would skip them
    assert first.sampler.state_dict()["position"] > state["position"] == 4
    resumed = make_loader(dataset, 2, True)
    resumed.load_state_dict(state)
    assert before + take(resumed, 6) == uninterrupted


def test_load_refuses_a_different_seed(dataset):
    loader = make_loader(dataset, 3, True)
    take(loader, 1)
    with pytest.raises(ValueError, match="data.seed=7"):
        make_loader(dataset, 3, True, seed=8).load_state_dict(loader.state_dict())


def test_create_rl_sampler_reads_data_config(dataset):
    s = create_rl_sampler({"shuffle": False, "seed": 5, "train_batch_size": 4}, dataset)
    assert (s.shuffle, s.seed, s.data_len) == (False, 5, 10)
    assert create_rl_sampler({}, dataset).shuffle is True
