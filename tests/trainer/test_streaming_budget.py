"""The streaming thread's bookkeeping (hybridrl/trainer/async_training.py) against hand-computed counts: verl's admission
budget per sync window, first-finished-first-trained, the staleness bound, and a rollout error reaching the step.

The rollout here is a plain function that finishes every admitted prompt at once with the weight version it is
told: what the budget and the queue do does not depend on how samples are decoded (the decoding itself is tested
in tests/workers/rollout/test_continuous.py, the whole mode in test_streaming.py)."""

import threading
import time

import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer.async_training import Streamer, StreamSettings

N = 2  # samples per prompt


class Prompts:
    """Numbered prompts, drawn in order; the rollout finishes each with `version` (or raises `error`)."""

    def __init__(self) -> None:
        self.drawn = 0
        self.version = 0
        self.error: Exception | None = None
        self.lock = threading.Lock()

    def draw(self, count: int) -> DataProto:
        with self.lock:
            ids = list(range(self.drawn, self.drawn + count))
            self.drawn += count
        return DataProto.from_dict({"prompt_id": torch.tensor(ids)},
                                   {"uid": np.array([f"p{i}" for i in ids], dtype=object)})

    def generate(self, per_rank: list[DataProto | None], max_steps: int, partial: bool) -> list[DataProto | None]:
        if self.error is not None:
            raise self.error
        out = []
        for prompts in per_rank:
            if prompts is None:
                out.append(None)
                continue
            rows = prompts.repeat(N, interleave=True)
            rows.batch["weight_version"] = torch.full((len(rows),), self.version)
            out.append(rows)
        return out


def _settle(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the streaming thread did not get there")
        time.sleep(0.01)


def _streamer(prompts: Prompts, threshold: float = 0.5, sync_every: int = 2, ranks: int = 2) -> Streamer:
    settings = StreamSettings(step_prompts=4, sync_every=sync_every, staleness_threshold=threshold, partial=True,
                              n=N, prompts_per_rank=8)
    return Streamer(prompts.generate, ranks, prompts.draw, settings)


def test_a_window_admits_its_budget_less_what_it_carries_over_and_steps_take_in_order():
    prompts = Prompts()
    streamer = _streamer(prompts, ranks=1)  # one rank: groups finish in the order they were drawn
    assert streamer.settings.window == 12  # ceil((1 + 0.5) x 2 syncs apart x 4 prompts)
    streamer.start()
    try:
        _settle(lambda: streamer.queue_size == 12)
        time.sleep(0.2)
        assert prompts.drawn == 12 and streamer.queue_size == 12  # the budget is spent: the thread waits
        first = streamer.take(4, version=0)
        assert list(first.batch.non_tensor_batch["uid"][::N]) == ["p0", "p1", "p2", "p3"]
        assert len(first.batch) == 4 * N and first.dropped == 0
        second = streamer.take(4, version=1)
        assert list(second.batch.non_tensor_batch["uid"][::N]) == ["p4", "p5", "p6", "p7"]
        time.sleep(0.2)
        assert prompts.drawn == 12  # taking does not open the window; a sync does
        with streamer.paused(drain=False, new_window=True):
            prompts.version = 2
        _settle(lambda: prompts.drawn == 20)  # the window's 12, less the 4 still queued at the sync
        time.sleep(0.2)
        assert prompts.drawn == 20 and streamer.queue_size == 12
    finally:
        streamer.close()


def test_groups_staler_than_the_bound_are_dropped_and_replaced():
    prompts = Prompts()
    streamer = _streamer(prompts, ranks=1)
    assert streamer.settings.max_staleness == 2  # a window's last prompts wait 1 update, the threshold's share 1 more
    streamer.start()
    try:
        _settle(lambda: streamer.queue_size == 12)
        prompts.version = 5
        taken = streamer.take(4, version=5 + 2)  # version 0 lags by 7: all twelve dropped, twelve fresh admitted
        assert taken.dropped == 12
        assert set(taken.batch.batch["weight_version"].tolist()) == {5}
        assert list(taken.batch.non_tensor_batch["uid"][::N]) == ["p12", "p13", "p14", "p15"]
        assert streamer.take(4, version=7).dropped == 0  # lags by 2: within the bound
    finally:
        streamer.close()


def test_a_rollout_error_reaches_the_waiting_step():
    prompts = Prompts()
    prompts.error = ValueError("the rollout broke")
    streamer = _streamer(prompts)
    streamer.start()
    try:
        with pytest.raises(RuntimeError, match="the streaming rollout failed") as raised:
            streamer.take(4, version=0)
        assert isinstance(raised.value.__cause__, ValueError)
    finally:
        streamer.close()


def test_prompts_spread_over_the_ranks_by_their_load():
    prompts = Prompts()
    seen: list[list[int]] = []

    def generate(per_rank, max_steps, partial):
        seen.append([0 if p is None else len(p) for p in per_rank])
        return prompts.generate(per_rank, max_steps, partial)

    streamer = Streamer(generate, 3, prompts.draw, _streamer(prompts, ranks=3).settings)
    streamer.start()
    try:
        _settle(lambda: streamer.queue_size == 12)
        assert seen[0] == [4, 4, 4]  # twelve prompts over three idle ranks
    finally:
        streamer.close()
