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


# A curriculum sampler of a user's own, written to verl's interface: built from (data_source, data_config),
# easiest prompts first (here: lowest index), moving its window by the batches it is shown.
CURRICULUM = '''
import torch
from torch.utils.data import Sampler


class IndexCurriculum(Sampler):
    def __init__(self, data_source, data_config):
        self.size = len(data_source)
        self.batch_size = data_config["train_batch_size"]
        self.offset = 0  # moved by update()
        self.seen_batches = []

    def __iter__(self):
        order = [(i + self.offset) % self.size for i in range(self.size)]
        yield from order

    def __len__(self):
        return self.size

    def update(self, batch):
        self.seen_batches.append(len(batch))
        self.offset += 1

    def state_dict(self):
        return {"offset": self.offset, "seen_batches": list(self.seen_batches)}

    def load_state_dict(self, state):
        self.offset = state["offset"]
        self.seen_batches = list(state["seen_batches"])


class Forgetful(IndexCurriculum):
    state_dict = None
'''


@pytest.fixture
def curriculum_file(tmp_path):
    path = tmp_path / "my_curriculum.py"
    path.write_text(CURRICULUM)
    return path


def data_config(class_path, class_name="IndexCurriculum", batch=3):
    from hybridrl.trainer.ppo_config import DataConfig, SamplerClassConfig

    return DataConfig(train_batch_size=batch, sampler=SamplerClassConfig(str(class_path), class_name))


def own_loader(dataset, config):
    from hybridrl.data.sampler import prompt_sampler

    return StatefulDataLoader(dataset, sampler=prompt_sampler(config, dataset), batch_size=config.train_batch_size,
                              drop_last=True, collate_fn=collate_fn)


def test_a_sampler_of_your_own_orders_the_prompts_and_resumes_from_its_state(dataset, curriculum_file):
    loader = own_loader(dataset, data_config(curriculum_file))
    batches = iter(loader)
    assert list(next(batches)["index"]) == [0, 1, 2]
    loader.sampler.update(batch=[0] * 24)  # what the trainer does after each step
    state = loader.state_dict()
    assert state["state"] == {"offset": 1, "seen_batches": [24]}
    resumed = own_loader(dataset, data_config(curriculum_file))
    resumed.load_state_dict(state)
    assert list(next(iter(resumed))["index"]) == [1, 2, 3]  # the curriculum's position, not the first batch
    with pytest.raises(ValueError, match="resume with the same data.sampler"):
        make_loader(dataset, 3, True).load_state_dict(state)


def test_a_sampler_loads_from_an_importable_module_and_without_state_resumes_from_its_start(
        dataset, curriculum_file, monkeypatch, caplog):
    monkeypatch.syspath_prepend(str(curriculum_file.parent))
    loader = own_loader(dataset, data_config("pkg://my_curriculum", "Forgetful"))
    assert type(loader.sampler).__name__ == "Forgetful" and loader.state_dict()["state"] is None
    with caplog.at_level("WARNING"):
        loader.load_state_dict(loader.state_dict())
    assert "draws prompts from its start" in caplog.text


def test_a_bad_sampler_setting_names_the_key(dataset, curriculum_file, tmp_path):
    from hybridrl.data.sampler import prompt_sampler
    from hybridrl.utils.typed_config import ConfigError

    with pytest.raises(FileNotFoundError, match="data.sampler.class_path"):
        prompt_sampler(data_config(tmp_path / "missing.py"), dataset)
    with pytest.raises(TypeError, match="must be a torch.utils.data.sampler.Sampler subclass"):
        prompt_sampler(data_config(curriculum_file, "Sampler_that_is_not_there"), dataset)
    with pytest.raises(ConfigError, match="set both"):
        data_config(curriculum_file, None)
    with pytest.raises(ValueError, match="dataloader_num_workers=0"):
        StatefulDataLoader(dataset, sampler=prompt_sampler(data_config(curriculum_file), dataset), batch_size=3,
                           num_workers=1)
