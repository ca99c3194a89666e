"""A seeded, resumable prompt order: a resumed run sees exactly the prompts it would have seen.

`ResumableSampler` draws each epoch's permutation from (seed, epoch). `StatefulDataLoader` (verl's name)
counts the rows the consumer has taken, not the indices prefetching workers were handed, so its
`state_dict()` resumes at the next unseen prompt.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Dataset, Sampler


class ResumableSampler(Sampler[int]):
    """Indices of one epoch per `iter()`, from `position` on; epoch e's order depends only on (seed, e)."""

    def __init__(self, data_len: int, shuffle: bool = True, seed: int = 1) -> None:
        if data_len < 1:
            raise ValueError(f"cannot sample from an empty dataset (data_len={data_len})")
        self.data_len = data_len
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.position = 0  # indices of the current epoch already handed out

    def order(self, epoch: int) -> list[int]:
        """The permutation for `epoch`."""
        if not self.shuffle:
            return list(range(self.data_len))
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch]))
        return rng.permutation(self.data_len).tolist()

    def __iter__(self) -> Iterator[int]:
        order = self.order(self.epoch)
        while self.position < self.data_len:
            self.position += 1
            yield order[self.position - 1]
        self.epoch += 1
        self.position = 0

    def __len__(self) -> int:
        return self.data_len

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "shuffle": self.shuffle}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if (state["seed"], state["shuffle"]) != (self.seed, self.shuffle):
            raise ValueError(f"checkpoint was taken with data.seed={state['seed']}, "
                             f"data.shuffle={state['shuffle']} but this run has seed={self.seed}, "
                             f"shuffle={self.shuffle}; resuming would change the prompt order")
        if not 0 <= state["position"] <= self.data_len:
            raise ValueError(f"checkpoint position {state['position']} does not fit a dataset of "
                             f"{self.data_len} rows; was the dataset changed since the checkpoint?")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class StatefulDataLoader(DataLoader):
    """A DataLoader over a `ResumableSampler` whose state counts the rows handed to the consumer."""

    def __init__(self, dataset: Dataset, *, sampler: ResumableSampler, **kwargs: Any) -> None:
        if not isinstance(sampler, ResumableSampler):
            raise TypeError(f"StatefulDataLoader needs a ResumableSampler, got {type(sampler).__name__}")
        super().__init__(dataset, sampler=sampler, **kwargs)
        self._state = sampler.state_dict()

    def __iter__(self) -> Iterator[Any]:
        sampler: ResumableSampler = self.sampler  # type: ignore[assignment]
        epoch, position = sampler.epoch, sampler.position
        self._state = sampler.state_dict()
        for batch in super().__iter__():
            position += self._rows(batch)
            self._state = {**self._state, "epoch": epoch, "position": position}
            yield batch
        self._state = sampler.state_dict()  # exhausted: the sampler has moved to the next epoch

    def _rows(self, batch: Any) -> int:
        if self.batch_size is None:
            raise ValueError("StatefulDataLoader counts rows by batch_size; pass batch_size, not "
                             "batch_sampler")
        if isinstance(batch, Mapping):
            for value in batch.values():
                if hasattr(value, "__len__"):
                    return len(value)  # the last batch may be short when drop_last=False
        return self.batch_size

    def state_dict(self) -> dict[str, Any]:
        return dict(self._state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.sampler.load_state_dict(state)  # type: ignore[union-attr]
        self._state = self.sampler.state_dict()  # type: ignore[union-attr]


def create_rl_sampler(data_config: Mapping[str, Any], dataset: Dataset) -> ResumableSampler:
    """verl's helper: reads `data.shuffle` and `data.seed`; unset keys keep ResumableSampler's defaults."""
    chosen = {key: data_config[key] for key in ("shuffle", "seed") if data_config.get(key) is not None}
    return ResumableSampler(len(dataset), **chosen)
