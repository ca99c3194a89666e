"""A seeded, resumable prompt order: a resumed run sees exactly the prompts it would have seen. `data.sampler`
names a sampler of your own instead (verl's interface), built as `cls(data_source=dataset, data_config=<data.*
read-only>)`; its `update(batch)` and `state_dict()` / `load_state_dict()`, where it has them, see every
trained batch and go with each checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import DataLoader, Dataset, Sampler

from hybridrl.utils.registry import load_class
from hybridrl.utils.typed_config import readonly_view

if TYPE_CHECKING:
    from hybridrl.trainer.ppo_config import DataConfig

logger = logging.getLogger(__name__)

SAMPLER_KEY = "data.sampler"


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
    """A DataLoader (verl's name) whose state counts the rows the consumer took, not those prefetching workers
    were handed: a `ResumableSampler`'s epoch and position, or a sampler of your own's `state_dict()` (which
    needs data.dataloader_num_workers=0)."""

    def __init__(self, dataset: Dataset, *, sampler: Sampler, **kwargs: Any) -> None:
        if not isinstance(sampler, Sampler):
            raise TypeError(f"StatefulDataLoader needs a torch.utils.data.Sampler, got {type(sampler).__name__}")
        if not isinstance(sampler, ResumableSampler) and kwargs.get("num_workers", 0):
            raise ValueError(f"{SAMPLER_KEY} names a sampler of your own, whose state is only exact when the "
                             f"loader draws rows as they are consumed: set data.dataloader_num_workers=0")
        super().__init__(dataset, sampler=sampler, **kwargs)
        self._state = self._sampler_state()

    def _sampler_state(self) -> dict[str, Any]:
        if isinstance(self.sampler, ResumableSampler):
            return self.sampler.state_dict()
        own = getattr(self.sampler, "state_dict", None)
        return {"sampler": type(self.sampler).__qualname__, "state": own() if callable(own) else None}

    def __iter__(self) -> Iterator[Any]:
        if not isinstance(self.sampler, ResumableSampler):
            yield from super().__iter__()  # its state is read when asked for (state_dict)
            return
        sampler = self.sampler
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
        # a sampler of your own changes between batches too (update), so its state is read now
        return dict(self._state) if isinstance(self.sampler, ResumableSampler) else self._sampler_state()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        own = "sampler" in state
        if own != (not isinstance(self.sampler, ResumableSampler)):
            raise ValueError(f"the checkpoint's prompt order came from "
                             f"{state['sampler'] if own else 'the seeded shuffle'}, this run's from "
                             f"{type(self.sampler).__qualname__}; resume with the same {SAMPLER_KEY}")
        if not own:
            self.sampler.load_state_dict(state)  # type: ignore[union-attr]
        elif state["state"] is not None and callable(getattr(self.sampler, "load_state_dict", None)):
            self.sampler.load_state_dict(state["state"])  # type: ignore[union-attr]
        else:
            logger.warning("%s.%s has no state_dict/load_state_dict: the resumed run draws prompts from its start, "
                           "not where the checkpoint stopped; give the sampler both methods for an exact resume",
                           SAMPLER_KEY, type(self.sampler).__qualname__)
        self._state = self._sampler_state()


def prompt_sampler(data_config: DataConfig, dataset: Dataset) -> Sampler:
    """The training prompts' sampler: `data.sampler`'s class when set, else the seeded `ResumableSampler`."""
    if data_config.sampler.class_path is None:
        return ResumableSampler(len(dataset), shuffle=data_config.shuffle, seed=data_config.seed)
    cls = load_class(data_config.sampler.class_path, data_config.sampler.class_name, f"{SAMPLER_KEY}.class_path",
                     Sampler)
    return cls(data_source=dataset, data_config=readonly_view(data_config))


def create_rl_sampler(data_config: Mapping[str, Any], dataset: Dataset) -> ResumableSampler:
    """verl's helper: reads `data.shuffle` and `data.seed`; unset keys keep ResumableSampler's defaults."""
    chosen = {key: data_config[key] for key in ("shuffle", "seed") if data_config.get(key) is not None}
    return ResumableSampler(len(dataset), **chosen)
