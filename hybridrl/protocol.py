"""DataProto: the unit of data that moves between the single controller and the worker groups (verl's): a
`TensorBatch`, per-row numpy arrays and a `meta_info` dict. verl-only members: compat/."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hybridrl.tensor_batch import RowIndex, TensorBatch, _as_index

__all__ = ["DataProto", "DataProtoError", "DataProtoItem", "object_column", "pad_dataproto_to_divisor",
           "unpad_dataproto"]


class DataProtoError(ValueError, AssertionError):
    """Inconsistent or conflicting DataProto contents; an AssertionError too, as verl raises."""


def object_column(values: Sequence[Any]) -> np.ndarray:
    """A 1-d object array with one entry per value, so equal-length lists or dicts stay one object per row."""
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        column[i] = value
    return column


def _is_nan(value: Any) -> bool:
    return isinstance(value, (float, np.floating)) and bool(np.isnan(value))


def deep_equal(a: Any, b: Any, _seen: set[tuple[int, int]] | None = None) -> bool:
    """Value equality through numpy arrays, tensors, lists, tuples and dicts, with NaN equal to NaN; a pair
    already being compared counts as equal, so cycles terminate."""
    seen = set() if _seen is None else _seen
    pair = (id(a), id(b))
    if pair in seen:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
            return False
        if a.dtype != object and b.dtype != object:
            try:
                return bool(np.array_equal(a, b, equal_nan=True))
            except TypeError:  # equal_nan is undefined for strings and other non-numeric dtypes
                return bool(np.array_equal(a, b))
        seen.add(pair)
        return all(deep_equal(x, y, seen) for x, y in zip(a.flat, b.flat, strict=True))
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return False
        seen.add(pair)
        return all(deep_equal(x, y, seen) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)) or a.keys() != b.keys():
            return False
        seen.add(pair)
        return all(deep_equal(a[k], b[k], seen) for k in a)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape \
            and bool(torch.equal(a, b))
    if _is_nan(a) or _is_nan(b):
        return _is_nan(a) and _is_nan(b)
    try:
        return bool(a == b)
    except Exception:  # an object whose == raises or is ambiguous cannot be shown equal
        return False


def merge_meta_info(metas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """meta_info of DataProtos concatenated from several workers: `metrics` gathered into one flat list per key
    (rank order), every other key equal wherever it appears (a setting that differs between ranks raises)."""
    merged: dict[str, Any] = {}
    gathered: dict[str, list[Any]] = {}
    for meta in metas:
        for key, value in meta.items():
            if key == "metrics":  # a worker's: one dict, or a list of dicts (per micro-batch or step)
                for metrics in [] if value is None else value if isinstance(value, (list, tuple)) else [value]:
                    if not isinstance(metrics, Mapping):
                        raise DataProtoError(f"meta_info['metrics'] must be a dict or a list of dicts, got "
                                             f"{type(metrics).__name__}")
                    for name, metric in metrics.items():
                        gathered.setdefault(name, []).extend(metric if isinstance(metric, list) else [metric])
            elif key in merged and not deep_equal(merged[key], value):
                raise DataProtoError(f"Conflicting values for meta_info key '{key}' across the concatenated "
                                     f"DataProtos: {merged[key]!r} vs {value!r}")
            else:
                merged.setdefault(key, value)
    if gathered:
        merged["metrics"] = gathered
    return merged


def _as_object_array(key: str, values: Any) -> np.ndarray:
    """A numpy array with one entry per row: arrays as they are (N-d too, as in verl), a list as a 1-d object
    array even when its rows are equal-length lists."""
    if isinstance(values, np.ndarray) and values.ndim >= 1:
        return values
    if isinstance(values, (list, tuple)):
        return object_column(values)
    raise TypeError(
        f"non_tensor_batch[{key!r}] must be a numpy array or list with one entry per row, "
        f"got {type(values).__name__}"
    )


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
        """Build from tensors and per-row values, which must agree on the number of rows."""
        tensors = dict(tensors or {})
        if not tensors and not non_tensors:
            raise ValueError("from_dict needs at least one tensor or non-tensor column")
        return cls(batch=TensorBatch(tensors) if tensors else None, non_tensor_batch=non_tensors,
                   meta_info=meta_info)

    def check_consistency(self) -> None:
        """Raise if any column's row count differs from the others, naming the column."""
        counts = {}
        if self.batch is not None:
            counts.update({f"batch[{k!r}]": v.shape[0] for k, v in self.batch.items()})
            if not len(self.batch):
                counts["batch"] = self.batch.num_rows
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray) or value.ndim < 1:
                raise TypeError(f"non_tensor_batch[{key!r}] must be a numpy array with one entry per row")
            counts[f"non_tensor_batch[{key!r}]"] = len(value)
        if len(set(counts.values())) > 1:
            detail = ", ".join(f"{name}: {n}" for name, n in counts.items())
            raise DataProtoError(f"DataProto columns disagree on the number of rows ({detail})")

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

    def __getitem__(self, index: RowIndex) -> DataProtoItem | DataProto:
        """An int gives one `DataProtoItem`; a slice, index array or boolean mask gives a DataProto."""
        if isinstance(index, (int, np.integer)):
            row, n = int(index), len(self)
            if not -n <= row < n:
                raise IndexError(f"row {row} out of range for a DataProto of {n} rows")
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
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=self.meta_info)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def select(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """A DataProto with only the named keys (None keeps all of that part); tensors are shared unless `deepcopy`."""
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
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

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
        keys = [list(batch_keys or []), list(non_tensor_batch_keys or []), list(meta_info_keys or [])]
        popped = self.select(*keys)  # validates the keys
        for part, names in zip((self.batch, self.non_tensor_batch, self.meta_info), keys, strict=True):
            for name in names:
                part.pop(name)
        return popped

    def union(self, other: DataProto) -> DataProto:
        """Merge `other`'s columns and meta_info into this DataProto (in place; returns self). A key in both must
        hold equal values (NaN equals NaN); `metrics` are gathered as in `concat`."""
        if len(self) != len(other) and len(self) and len(other):
            raise DataProtoError(f"union: this DataProto has {len(self)} rows but the other has {len(other)}")
        for part, mine, theirs in [("batch", self.batch or {}, other.batch or {}),  # all checked before any change
                                   ("non_tensor_batch", self.non_tensor_batch, other.non_tensor_batch),
                                   ("meta_info", self.meta_info, other.meta_info)]:
            for key, value in theirs.items():  # metrics are gathered, never a conflict
                if (part, key) != ("meta_info", "metrics") and key in mine and not deep_equal(mine[key], value):
                    raise DataProtoError(f"union: {part} key {key!r} exists in both with different values")
        if other.batch is not None:
            if self.batch is None:
                self.batch = TensorBatch(batch_size=len(other))
            for key, value in other.batch.items():
                self.batch[key] = value
        self.non_tensor_batch.update(other.non_tensor_batch)
        merged = merge_meta_info([self.meta_info, other.meta_info])
        self.meta_info.clear()  # in place: a caller may hold this dict
        self.meta_info.update(merged)
        self.check_consistency()
        return self

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into `chunks` equal parts; raises when the rows do not divide (pad first)."""
        if chunks <= 0:
            raise DataProtoError(f"chunk: chunks must be positive, got {chunks}")
        if len(self) % chunks:
            raise DataProtoError(
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
        """Stack DataProtos row-wise (e.g. the ranks' outputs), merging meta_info by `merge_meta_info`."""
        if not data:
            raise ValueError("concat needs at least one DataProto")
        batches = [d.batch for d in data]
        if any(b is None for b in batches) and not all(b is None for b in batches):
            raise DataProtoError("concat: some DataProtos have a tensor batch and some do not")
        batch = None if batches[0] is None else TensorBatch.cat(batches)
        keys = set(data[0].non_tensor_batch)
        for i, d in enumerate(data[1:], start=1):
            if set(d.non_tensor_batch) != keys:
                raise DataProtoError(f"concat: DataProto {i} has non_tensor_batch keys {sorted(d.non_tensor_batch)} "
                                     f"but DataProto 0 has {sorted(keys)}")
        non_tensors = {k: np.concatenate([d.non_tensor_batch[k] for d in data]) for k in data[0].non_tensor_batch}
        meta_info = merge_meta_info([d.meta_info for d in data])
        return type(data[0])(batch=batch, non_tensor_batch=non_tensors, meta_info=meta_info)

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

    def to(self, device: str | torch.device) -> DataProto:
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def __getstate__(self) -> tuple:
        # the TensorBatch pickles its tensors as numpy buffers (see TensorBatch.__getstate__)
        return self.batch, self.non_tensor_batch, self.meta_info

    def __setstate__(self, state: tuple | dict) -> None:
        if isinstance(state, dict):  # a DataProto pickled before it defined __getstate__
            self.__dict__.update(state)
            return
        self.batch, self.non_tensor_batch, self.meta_info = state


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Append copies of the first rows (real rows, so workers compute on well-formed inputs) until len(data)
    divides by size_divisor; returns the padded DataProto and the rows added."""
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
