"""A small worker class exercised by both backends' tests."""

import os

import numpy as np
import torch
import torch.distributed as dist

from hybridrl.controller import Dispatch, Execute, TypedWorkerGroup, Worker, register
from hybridrl.protocol import DataProto


class ScaleWorker(Worker):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_ranks(self) -> float:
        # Sum of (rank + 1) over the group: 1 + 2 = 3 for two ranks.
        value = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(value)
        return value.item()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def read_env(self, keys: list[str]) -> dict[str, str | None]:
        return {key: os.environ.get(key) for key in keys}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def scale_rows(self, data: DataProto) -> DataProto:
        return self._scaled(data)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def scale_rows_async(self, data: DataProto) -> DataProto:
        out = self._scaled(data)
        out.batch["x"] = out.batch.pop("y")  # so the output can feed scale_rows again
        return out.select(batch_keys=["x"], non_tensor_batch_keys=["tag"])

    def _scaled(self, data: DataProto) -> DataProto:
        n = len(data)
        return DataProto.from_dict(
            {"y": data.batch["x"] * self.scale, "rank": torch.full((n,), self.rank), "pid": torch.full((n,), os.getpid())},
            {"tag": data.non_tensor_batch["tag"]},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def sample(self, data: DataProto, n: int) -> DataProto:
        """n outputs per input row, like a rollout with n samples per prompt."""
        return data.repeat(n, interleave=True)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def count_rows(self, data: DataProto) -> dict:
        return {"rank": self.rank, "rows": len(data)}

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def tag_with_rank(self, value: str) -> str:
        return f"{value}@{self.rank}"

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def rank_zero_only(self) -> int:
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def execute_on_rank_zero(self, value: int) -> int:
        return value + self.rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def apply(self, fn, data: DataProto) -> DataProto:
        return fn(data)


def rows(n: int) -> DataProto:
    return DataProto.from_dict(
        {"x": torch.arange(n, dtype=torch.float32)},
        {"tag": np.array([f"r{i}" for i in range(n)], dtype=object)},
    )


def add_one(data: DataProto) -> DataProto:
    return DataProto.from_dict({"x": data.batch["x"] + 1})


class FailsOnRankZero(ScaleWorker):
    """Rank 0 fails before it joins the process group, as a worker whose model path is wrong would."""

    def __init__(self) -> None:
        if os.environ["RANK"] == "0":
            raise RuntimeError("no such model")
        super().__init__(scale=1.0)


class ScaleRole(TypedWorkerGroup):
    """A handle on a ScaleWorker role of a HybridWorker group: what the group checks drive per role."""

    worker_cls = ScaleWorker

    def call(self, method, /, *args, **kwargs):
        return self._call(method, *args, **kwargs)
