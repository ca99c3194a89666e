"""DataProto: the unit of data that moves between the single controller and the worker groups.

A DataProto has three parts, as in verl:

- `batch`: a `TensorBatch` of tensors sharing the batch dimension (`input_ids`, `responses`, ...);
- `non_tensor_batch`: a dict of numpy object arrays with one entry per row (`uid`, `data_source`, ...);
- `meta_info`: a plain dict for everything that is not per row (sampling settings, metrics, timing).

Every row-wise operation (indexing, chunking, repeating, concatenating) acts on `batch` and
`non_tensor_batch` together, so the two never drift apart.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hybridrl.tensor_batch import RowIndex, TensorBatch, _as_index

__all__ = ["DataProto", "DataProtoItem", "pad_dataproto_to_divisor", "unpad_dataproto"]


def _as_object_array(key: str, values: Any) -> np.ndarray:
    """A 1-D numpy object array holding one Python object per row."""
    if isinstance(values, np.ndarray) and values.ndim >= 1:
        if values.dtype == object and values.ndim == 1:
            return values
        out = np.empty(len(values), dtype=object)
        out[:] = list(values)
        return out
    if isinstance(values, (list, tuple)):
        out = np.empty(len(values), dtype=object)
        for i, value in enumerate(values):  # element-wise so lists of lists stay one object per row
            out[i] = value
        return out
    raise TypeError(
        f"non_tensor_batch[{key!r}] must be a numpy array or list with one entry per row, "
        f"got {type(values).__name__}"
    )


def _values_equal(a: Any, b: Any) -> bool:
    """Equality for union conflict checks; NaN equals NaN so float columns can be re-unioned."""
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    try:
        equal = a == b
        return bool(np.all(equal)) if isinstance(equal, np.ndarray) else bool(equal)
    except Exception:  # objects whose == raises cannot be compared; treat as conflicting
        return False


@dataclass
class DataProtoItem:
    """One row of a DataProto: `batch` holds that row's tensors (without the batch dimension)."""

    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


class DataProto:
    """A batch of rows: tensors (`batch`), per-row Python objects (`non_tensor_batch`) and `meta_info`."""

    def __init__(
        self,
        batch: TensorBatch | Mapping[str, torch.Tensor] | None = None,
        non_tensor_batch: Mapping[str, Any] | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ) -> None:
        if batch is not None and not isinstance(batch, TensorBatch):
            batch = TensorBatch(batch)
        self.batch: TensorBatch | None = batch if (batch is None or len(batch) or batch.num_rows) else None
        self.non_tensor_batch: dict[str, np.ndarray] = {
            key: _as_object_array(key, value) for key, value in (non_tensor_batch or {}).items()
        }
        self.meta_info: dict[str, Any] = dict(meta_info or {})
        self.check_consistency()

    # ----- construction --------------------------------------------------------------------------------
    @classmethod
    def from_single_dict(cls, data: Mapping[str, Any], meta_info: Mapping[str, Any] | None = None) -> DataProto:
        """Split one dict into tensors (-> batch) and numpy arrays (-> non_tensor_batch)."""
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, np.ndarray):
                non_tensors[key] = value
            else:
                raise TypeError(
                    f"from_single_dict: {key!r} is a {type(value).__name__}; values must be torch.Tensor "
                    f"(batch) or np.ndarray (non_tensor_batch). Put scalars and settings in meta_info."
                )
        return cls.from_dict(tensors, non_tensors, meta_info)

    @classmethod
    def from_dict(
        cls,
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Any] | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ) -> DataProto:
        """Build from tensors and per-row values; all must agree on the number of rows."""
        tensors = dict(tensors or {})
        if not tensors and not non_tensors:
            raise ValueError("from_dict needs at least one tensor or non-tensor column")
        return cls(batch=TensorBatch(tensors) if tensors else None, non_tensor_batch=non_tensors,
                   meta_info=meta_info)

    # ----- invariants ----------------------------------------------------------------------------------
    def check_consistency(self) -> None:
        """Raise if any column's row count differs from the others, naming the column."""
        counts = {}
        if self.batch is not None:
            counts.update({f"batch[{k!r}]": v.shape[0] for k, v in self.batch.items()})
            if not len(self.batch):
                counts["batch"] = self.batch.num_rows
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray) or value.ndim != 1:
                raise TypeError(f"non_tensor_batch[{key!r}] must be a 1-D numpy object array")
            counts[f"non_tensor_batch[{key!r}]"] = len(value)
        if len(set(counts.values())) > 1:
            detail = ", ".join(f"{name}: {n}" for name, n in counts.items())
            raise ValueError(f"DataProto columns disagree on the number of rows ({detail})")

    def __len__(self) -> int:
        if self.batch is not None:
            return self.batch.num_rows
        if self.non_tensor_batch:
            return len(next(iter(self.non_tensor_batch.values())))
        return 0

    def __repr__(self) -> str:
        keys = list(self.batch.keys()) if self.batch is not None else []
        return (f"DataProto(rows={len(self)}, batch={keys}, non_tensor_batch={list(self.non_tensor_batch)}, "
                f"meta_info={list(self.meta_info)})")

    # ----- row access ----------------------------------------------------------------------------------
    def __getitem__(self, index: RowIndex) -> DataProtoItem | DataProto:
        """An int gives one `DataProtoItem`; a slice, index array or boolean mask gives a DataProto."""
        if isinstance(index, (int, np.integer)):
            n = len(self)
            if not -n <= int(index) < n:
                raise IndexError(f"row {int(index)} out of range for a DataProto of {n} rows")
            row = int(index)
            tensors = {k: v[row] for k, v in self.batch.items()} if self.batch is not None else {}
            values = {k: v[row] for k, v in self.non_tensor_batch.items()}
            return DataProtoItem(batch=tensors, non_tensor_batch=values, meta_info=self.meta_info)
        return self.select_rows(index)

    def select_rows(self, index: RowIndex) -> DataProto:
        """Rows picked by a slice, integer indices or a boolean mask, in that order."""
        idx = _as_index(index)
        if isinstance(idx, int):
            idx = [idx]
        np_idx = idx if isinstance(idx, slice) else idx.numpy()
        batch = self.batch.rows(idx) if self.batch is not None else None
        non_tensors = {k: v[np_idx] for k, v in self.non_tensor_batch.items()}
        return DataProto(batch=batch, non_tensor_batch=non_tensors, meta_info=self.meta_info)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    # ----- column operations ---------------------------------------------------------------------------
    def select(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """A DataProto with only the named keys (None keeps all of that part).

        Without `deepcopy` the tensors are shared with this DataProto (no copy), as in verl.
        """
        batch = None
        if self.batch is not None:
            batch = self.batch.select(self.batch.keys() if batch_keys is None else list(batch_keys))
        non_tensors = self._pick(self.non_tensor_batch, non_tensor_batch_keys, "non_tensor_batch")
        meta = self._pick(self.meta_info, meta_info_keys, "meta_info")
        if batch_keys is not None and self.batch is None and list(batch_keys):
            raise KeyError(f"select: batch keys {list(batch_keys)} requested but this DataProto has no batch")
        if deepcopy:
            batch = batch.clone() if batch is not None else None
            non_tensors, meta = copy.deepcopy(non_tensors), copy.deepcopy(meta)
        return DataProto(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

    @staticmethod
    def _pick(source: dict, keys: Iterable[str] | None, part: str) -> dict:
        if keys is None:
            return dict(source)
        missing = [k for k in keys if k not in source]
        if missing:
            raise KeyError(f"{part} has no key(s) {missing}; available: {sorted(source)}")
        return {k: source[k] for k in keys}

    def pop(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
    ) -> DataProto:
        """Remove the named keys from this DataProto and return them as a new one (same rows)."""
        batch_keys, non_tensor_batch_keys = list(batch_keys or []), list(non_tensor_batch_keys or [])
        meta_info_keys = list(meta_info_keys or [])
        popped = self.select(batch_keys, non_tensor_batch_keys, meta_info_keys)  # validates the keys
        for key in batch_keys:
            self.batch.pop(key)
        for key in non_tensor_batch_keys:
            self.non_tensor_batch.pop(key)
        for key in meta_info_keys:
            self.meta_info.pop(key)
        return popped

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> DataProto:
        """Rename batch keys in place (and return self, for chaining)."""
        old_keys = [old_keys] if isinstance(old_keys, str) else list(old_keys)
        new_keys = [new_keys] if isinstance(new_keys, str) else list(new_keys)
        if len(old_keys) != len(new_keys):
            raise ValueError(f"rename: {len(old_keys)} old keys but {len(new_keys)} new keys")
        for old, new in zip(old_keys, new_keys, strict=True):
            self.batch[new] = self.batch.pop(old)
        return self

    def union(self, other: DataProto) -> DataProto:
        """Merge `other`'s columns and meta_info into this DataProto (in place; returns self).

        A key present in both must hold equal values, otherwise the union raises naming the key:
        silently keeping one of two different `old_log_probs` would corrupt training.
        """
        if len(self) != len(other) and len(self) and len(other):
            raise ValueError(f"union: this DataProto has {len(self)} rows but the other has {len(other)}")
        self._check_union_conflicts(other)  # before any change, so a failed union leaves self intact
        if other.batch is not None:
            if self.batch is None:
                self.batch = TensorBatch(batch_size=len(other))
            for key, value in other.batch.items():
                self.batch[key] = value
        self.non_tensor_batch.update(other.non_tensor_batch)
        self.meta_info.update(other.meta_info)
        self.check_consistency()
        return self

    def _check_union_conflicts(self, other: DataProto) -> None:
        if self.batch is not None and other.batch is not None:
            for key, value in other.batch.items():
                if key in self.batch and not (
                    self.batch[key].shape == value.shape and torch.equal(self.batch[key], value)
                ):
                    raise ValueError(f"union: batch key {key!r} exists in both with different values")
        for key, value in other.non_tensor_batch.items():
            mine = self.non_tensor_batch.get(key)
            if mine is not None and not all(_values_equal(a, b) for a, b in zip(mine, value, strict=True)):
                raise ValueError(f"union: non_tensor_batch key {key!r} exists in both with different values")
        for key, value in other.meta_info.items():
            if key in self.meta_info and not _values_equal(self.meta_info[key], value):
                raise ValueError(f"union: meta_info key {key!r} exists in both with different values")

    # ----- row-wise reshaping --------------------------------------------------------------------------
    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into `chunks` equal parts; raises when the rows do not divide (pad first)."""
        if chunks <= 0:
            raise ValueError(f"chunk: chunks must be positive, got {chunks}")
        if len(self) % chunks:
            raise ValueError(
                f"chunk: {len(self)} rows do not divide into {chunks} chunks; "
                f"use pad_dataproto_to_divisor(data, {chunks}) first and unpad_dataproto afterwards"
            )
        size = len(self) // chunks
        return [self.select_rows(slice(i * size, (i + 1) * size)) for i in range(chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive parts of `split_size` rows (the last may be shorter)."""
        if split_size <= 0:
            raise ValueError(f"split: split_size must be positive, got {split_size}")
        return [self.select_rows(slice(i, i + split_size)) for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Stack DataProtos row-wise; meta_info comes from the first."""
        if not data:
            raise ValueError("concat needs at least one DataProto")
        batches = [d.batch for d in data]
        if any(b is None for b in batches) and not all(b is None for b in batches):
            raise ValueError("concat: some DataProtos have a tensor batch and some do not")
        batch = None if batches[0] is None else TensorBatch.cat(batches)
        keys = set(data[0].non_tensor_batch)
        for i, d in enumerate(data[1:], start=1):
            if set(d.non_tensor_batch) != keys:
                raise ValueError(f"concat: DataProto {i} has non_tensor_batch keys {sorted(d.non_tensor_batch)} "
                                 f"but DataProto 0 has {sorted(keys)}")
        non_tensors = {k: np.concatenate([d.non_tensor_batch[k] for d in data]) for k in data[0].non_tensor_batch}
        return DataProto(batch=batch, non_tensor_batch=non_tensors, meta_info=data[0].meta_info)

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Repeat every row. interleave: a,a,b,b (each prompt's samples together); else a,b,a,b."""
        if repeat_times < 1:
            raise ValueError(f"repeat: repeat_times must be >= 1, got {repeat_times}")
        order = np.arange(len(self))
        order = np.repeat(order, repeat_times) if interleave else np.tile(order, repeat_times)
        return self.select_rows(order)

    def reorder(self, indices: torch.Tensor | np.ndarray | Sequence[int]) -> None:
        """Permute the rows in place: row i becomes old row indices[i]."""
        reordered = self.select_rows(indices)
        if len(reordered) != len(self):
            raise ValueError(f"reorder: got {len(reordered)} indices for {len(self)} rows")
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    # ----- devices, copies, persistence ----------------------------------------------------------------
    def to(self, device: str | torch.device) -> DataProto:
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def copy(self) -> DataProto:
        return self.select(deepcopy=True)

    def save_to_disk(self, path: str | Path) -> None:
        """Write with pickle protocol 5 (tensors stored as raw numpy buffers)."""
        with open(path, "wb") as f:
            pickle.dump(self, f, protocol=5)

    @staticmethod
    def load_from_disk(path: str | Path) -> DataProto:
        with open(path, "rb") as f:
            data = pickle.load(f)
        if not isinstance(data, DataProto):
            raise TypeError(f"{path} does not hold a DataProto (found {type(data).__name__})")
        return data


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Append copies of the first rows until len(data) divides by size_divisor.

    Returns the padded DataProto and the number of rows added (0 when it already divides).
    Real rows are used as padding (not zeros) so every worker computes on well-formed inputs.
    """
    if size_divisor <= 0:
        raise ValueError(f"size_divisor must be positive, got {size_divisor}")
    if len(data) == 0:
        raise ValueError("cannot pad an empty DataProto: there is no row to repeat")
    pad_size = (-len(data)) % size_divisor
    if pad_size == 0:
        return data, 0
    filler = np.arange(pad_size) % len(data)
    return DataProto.concat([data, data.select_rows(filler)]), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the `pad_size` rows that pad_dataproto_to_divisor appended."""
    if pad_size < 0 or pad_size > len(data):
        raise ValueError(f"pad_size {pad_size} is out of range for {len(data)} rows")
    return data.select_rows(slice(0, len(data) - pad_size)) if pad_size else data
