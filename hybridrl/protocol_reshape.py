"""Reshaping a DataProto's rows: folding groups of rows into one, and unfolding them again.

`fold_batch_dim(data, g)` turns B rows into g rows of B/g each (tensor (B, ...) -> (g, B/g, ...),
per-row values likewise), e.g. to keep each prompt's n samples together through a shuffle;
`unfold_batch_dim` undoes it. `split_columns` serves `DataProto.unfold_column_chunks`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from hybridrl.protocol_merge import DataProtoError
from hybridrl.tensor_batch import TensorBatch

if TYPE_CHECKING:
    from hybridrl.protocol import DataProto


def fold_batch_dim(data: DataProto, new_batch_size: int) -> DataProto:
    """Group consecutive rows: B rows become `new_batch_size` rows of B / new_batch_size each."""
    rows = len(data)
    if new_batch_size <= 0 or rows % new_batch_size:
        raise DataProtoError(f"fold_batch_dim: {rows} rows do not fold into {new_batch_size} rows")
    batch = None
    if data.batch is not None:
        tensors = {k: v.reshape(new_batch_size, -1, *v.shape[1:]) for k, v in data.batch.items()}
        batch = TensorBatch(tensors, batch_size=new_batch_size)
    non_tensors = {k: v.reshape(new_batch_size, -1, *v.shape[1:]) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensors, meta_info=data.meta_info)


def unfold_batch_dim(data: DataProto, batch_dims: int = 2) -> DataProto:
    """Flatten the leading `batch_dims` dimensions of every column back into rows (fold's inverse)."""
    if batch_dims < 1:
        raise DataProtoError(f"unfold_batch_dim: batch_dims must be >= 1, got {batch_dims}")

    def flat(shape: tuple[int, ...], key: str) -> tuple[int, ...]:
        if len(shape) < batch_dims:
            raise DataProtoError(f"unfold_batch_dim: {key!r} has {len(shape)} dims, fewer than batch_dims={batch_dims}")
        return (int(np.prod(shape[:batch_dims])), *shape[batch_dims:])

    batch = None
    if data.batch is not None:
        tensors = {k: v.reshape(flat(tuple(v.shape), k)) for k, v in data.batch.items()}
        rows = next(iter(tensors.values())).shape[0] if tensors else None
        batch = TensorBatch(tensors, batch_size=rows)
    non_tensors = {k: v.reshape(flat(v.shape, k)) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensors, meta_info=data.meta_info)


def _as_table(key: str, column: np.ndarray) -> np.ndarray:
    """A (rows, L, ...) view of a column: N-d arrays as they are; a 1-d column whose rows are equal-length
    sequences (how hybridrl stores lists of lists) as a (rows, L) object array."""
    if column.ndim >= 2:
        return column
    lengths = {len(row) if isinstance(row, (list, tuple, np.ndarray)) else -1 for row in column}
    if len(lengths) != 1 or -1 in lengths:
        raise DataProtoError(f"unfold_column_chunks: non_tensor_batch[{key!r}] has no second dimension to split "
                             f"(its rows must be sequences of one length)")
    table = np.empty((len(column), lengths.pop()), dtype=object)
    for i, row in enumerate(column):
        table[i, :] = list(row)
    return table


def split_columns(values: torch.Tensor | np.ndarray, n_split: int, key: str):
    """(rows, L, ...) -> (rows * n_split, L / n_split, ...): each row's second dimension cut into n_split rows."""
    if isinstance(values, np.ndarray):
        values = _as_table(key, values)
    if values.ndim < 2 or values.shape[1] % n_split:
        raise DataProtoError(f"unfold_column_chunks: {key!r} of shape {tuple(values.shape)} does not split its "
                             f"second dimension into {n_split}")
    return values.reshape(values.shape[0] * n_split, values.shape[1] // n_split, *values.shape[2:])
