"""Futures of DataProtos, and the per-rank shards that dispatch sends to workers.

A non-blocking DP_COMPUTE_PROTO call returns a `DataProtoFuture`: the per-rank results stay in Ray's
object store. Passing that future to the next call sends each rank only the object references, and
every rank fetches what it needs straight from the store, so the batch never travels through the driver.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from hybridrl.protocol import DataProto, pad_dataproto_to_divisor


def resolve(items: list) -> list:
    """Values of a list of Ray object references (or of plain values, for the local backend)."""
    ray = sys.modules.get("ray")
    if ray is not None and any(isinstance(i, ray.ObjectRef) for i in items):
        return ray.get(list(items))
    return list(items)


@dataclass
class DataProtoFuture:
    """Per-rank outputs of a DataProto-returning call that have not been fetched yet."""

    futures: list

    def get(self) -> DataProto:
        """Fetch every rank's part and concatenate them (in rank order)."""
        return DataProto.concat(resolve(self.futures))


@dataclass
class ProtoShard:
    """What one rank receives for a DataProto argument of a DP_COMPUTE_PROTO call.

    Either `data` (the rank's chunk, cut by the driver) or `futures` (references to a previous call's
    per-rank outputs, which the worker fetches and cuts itself). `real_rows` counts the rows of the chunk
    that are not padding; the worker drops the outputs of padding rows before returning.
    """

    data: DataProto | None = None
    real_rows: int | None = None
    futures: list | None = None
    rank: int = 0
    world_size: int = 1

    def materialize(self) -> DataProto:
        if self.data is not None:
            return self.data
        whole = DataProto.concat(resolve(self.futures))
        padded, _ = pad_dataproto_to_divisor(whole, self.world_size)
        chunk = padded.chunk(self.world_size)[self.rank]
        self.real_rows = max(0, min(len(chunk), len(whole) - self.rank * len(chunk)))
        self.data = chunk
        return chunk


def materialize_arg(value: Any) -> Any:
    if isinstance(value, ProtoShard):
        return value.materialize()
    if isinstance(value, DataProtoFuture):
        return value.get()
    return value


def trim_padding(output: Any, shard: ProtoShard) -> Any:
    """Drop the outputs that belong to padding rows of this rank's chunk.

    A method may return k rows per input row (e.g. k samples per prompt); padding rows sit at the end of
    the chunk, so their outputs are the last k * padding rows.
    """
    rows, real = len(shard.data), shard.real_rows
    if real is None or real == rows or not isinstance(output, DataProto):
        return output
    if len(output) % rows:
        raise ValueError(
            f"a DP_COMPUTE_PROTO method returned {len(output)} rows for a chunk of {rows} rows that "
            f"includes {rows - real} padding rows; outputs must be a whole number of rows per input row "
            f"so the padding can be removed (or pass a batch that divides by the world size)"
        )
    per_row = len(output) // rows
    return output.select_rows(slice(0, real * per_row))
