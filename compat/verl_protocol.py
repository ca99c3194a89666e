"""verl's `verl.protocol` (and `from verl import DataProto`, `verl.utils.tensordict_utils`) over hybridrl's
core DataProto, for code and tests written against verl (compat/verl_shim.py maps those names here).

`DataProto` adds verl's extra members to the core's, and the core's operations keep the class of their
input. The module functions are verl's: batch folding, tensor serialisation, the union and padding
helpers, and the TensorDict conversions (with the optional tensordict package).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from hybridrl import protocol as core
from hybridrl.protocol import (
    DataProtoError,
    DataProtoItem,
    deep_equal,
    object_column,
    pad_dataproto_to_divisor,
    unpad_dataproto,
)
from hybridrl.tensor_batch import RowIndex, TensorBatch

__all__ = [
    "DataProto",
    "DataProtoError",
    "DataProtoItem",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "fold_batch_dim",
    "get_tensordict",
    "pad_dataproto_to_divisor",
    "serialize_single_tensor",
    "serialize_tensordict",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
]


def require_tensordict() -> ModuleType:
    """The tensordict module, or an ImportError that names the package to install."""
    try:
        import tensordict
    except ImportError as err:
        raise ImportError(
            "this conversion needs the optional package tensordict (pip install 'tensordict>=0.10'); "
            "hybridrl's own DataProto does not use it"
        ) from err
    return tensordict


def non_tensor_stack(values: Any):
    """One NonTensorData per row, stacked: keeps nested lists and dicts as they are, row by row."""
    td = require_tensordict()
    return td.NonTensorStack.from_list([td.NonTensorData(item) for item in values])


def _check_verl_layout(num_batch_dims: int, auto_padding: bool) -> None:
    """verl's `num_batch_dims` must be 1 (`fold_batch_dim` folds rows) and `auto_padding` False: pad explicitly
    with `pad_dataproto_to_divisor`, so no caller mistakes a padded row for data."""
    if num_batch_dims != 1:
        raise DataProtoError(f"from_dict: a DataProto has one batch dimension, got num_batch_dims={num_batch_dims}")
    if auto_padding:
        raise DataProtoError("from_dict: auto_padding is not supported; pad with pad_dataproto_to_divisor(data, n) "
                             "before chunking and unpad_dataproto afterwards")


class DataProto(core.DataProto):
    """The core DataProto with verl's extra members (see the module docstring)."""

    @classmethod
    def from_dict(cls, tensors: Mapping[str, torch.Tensor] | None = None, non_tensors: Mapping[str, Any] | None = None,
                  meta_info: Mapping[str, Any] | None = None, num_batch_dims: int = 1,
                  auto_padding: bool = False) -> DataProto:
        """The core's `from_dict` with verl's two layout arguments (`_check_verl_layout`)."""
        _check_verl_layout(num_batch_dims, auto_padding)
        return super().from_dict(tensors, non_tensors, meta_info)

    @classmethod
    def from_single_dict(cls, data: Mapping[str, Any], meta_info: Mapping[str, Any] | None = None,
                         auto_padding: bool = False) -> DataProto:
        _check_verl_layout(1, auto_padding)
        return super().from_single_dict(data, meta_info)

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> DataProto:
        """Rename batch keys in place (and return self, for chaining)."""
        old_keys = [old_keys] if isinstance(old_keys, str) else list(old_keys)
        new_keys = [new_keys] if isinstance(new_keys, str) else list(new_keys)
        if len(old_keys) != len(new_keys):
            raise ValueError(f"rename: {len(old_keys)} old keys but {len(new_keys)} new keys")
        for old, new in zip(old_keys, new_keys, strict=True):
            self.batch[new] = self.batch.pop(old)
        return self

    def copy(self) -> DataProto:
        """A deep copy (tensors cloned)."""
        return self.select(deepcopy=True)

    def select_idxs(self, idxs: RowIndex) -> DataProto:
        """verl's name for `select_rows` with integer indices or a boolean mask."""
        return self.select_rows(idxs)

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        """Rows start:end:step as a DataProto (verl's name; `data[start:end]` does the same)."""
        return self.select_rows(slice(start, end, step))

    def sample_level_repeat(self, repeat_times: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Repeat row i repeat_times[i] times, keeping each row's copies together (0 drops the row)."""
        counts = np.asarray(repeat_times.tolist() if isinstance(repeat_times, torch.Tensor) else repeat_times)
        if counts.ndim != 1 or len(counts) != len(self) or (counts < 0).any():
            raise DataProtoError(f"sample_level_repeat: need one count >= 0 per row ({len(self)}), got {counts.tolist()}")
        return self.select_rows(np.repeat(np.arange(len(self)), counts.astype(np.int64)))

    def unfold_column_chunks(self, n_split: int, split_keys: Sequence[str] | None = None) -> DataProto:
        """Cut the second dimension of the `split_keys` columns into n_split rows each and repeat the other
        columns, keeping rows aligned; a column of equal-length lists splits like a (rows, L) array."""
        split = set(split_keys or [])
        unknown = split - set(self.batch.keys() if self.batch is not None else []) - set(self.non_tensor_batch)
        if unknown:
            raise KeyError(f"unfold_column_chunks: no column(s) {sorted(unknown)}")
        repeated = self.repeat(n_split, interleave=True)
        batch = None
        if self.batch is not None:
            tensors = {k: split_columns(v, n_split, k) if k in split else repeated.batch[k]
                       for k, v in self.batch.items()}
            batch = TensorBatch(tensors, batch_size=len(self) * n_split)
        non_tensors = {k: split_columns(v, n_split, k) if k in split else repeated.non_tensor_batch[k]
                       for k, v in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=self.meta_info)

    def make_iterator(self, mini_batch_size: int, epochs: int, seed: int | None = None,
                      dataloader_kwargs: Mapping[str, Any] | None = None):
        """Mini-batches of `mini_batch_size` rows, epoch after epoch (verl's `make_iterator`): in order, or with
        `dataloader_kwargs={"shuffle": True}` a fresh permutation per epoch from `seed`; other keys raise."""
        options = dict(dataloader_kwargs or {})
        shuffle = bool(options.pop("shuffle", False))
        if options:
            raise DataProtoError(f"make_iterator: unsupported dataloader_kwargs {sorted(options)} (only shuffle)")
        if mini_batch_size <= 0 or len(self) % mini_batch_size:
            raise DataProtoError(f"make_iterator: {len(self)} rows do not divide into mini-batches of {mini_batch_size}")
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        for _ in range(epochs):
            order = (torch.randperm(len(self), generator=generator, device="cpu") if shuffle
                     else torch.arange(len(self), device="cpu"))  # row indices: on the CPU (`_as_index`)
            for start in range(0, len(self), mini_batch_size):
                yield self.select_rows(order[start:start + mini_batch_size])

    def to_tensordict(self):
        """This DataProto as a tensordict.TensorDict (needs the optional tensordict package)."""
        return to_tensordict(self)

    @classmethod
    def from_tensordict(cls, tensor_dict, meta_info: Mapping[str, Any] | None = None,
                        num_batch_dims: int = 1) -> DataProto:
        """A DataProto from a TensorDict made by `to_tensordict` (or verl's tensordict utilities)."""
        return from_tensordict(cls, tensor_dict, dict(meta_info or {}), num_batch_dims)

    def save_to_disk(self, path: str | Path) -> None:
        """Write with pickle protocol 5 (tensors stored as raw numpy buffers)."""
        with open(path, "wb") as f:
            pickle.dump(self, f, protocol=5)

    @staticmethod
    def load_from_disk(path: str | Path) -> DataProto:
        with open(path, "rb") as f:
            data = pickle.load(f)
        if not isinstance(data, core.DataProto):
            raise TypeError(f"{path} does not hold a DataProto (found {type(data).__name__})")
        return data


def union_tensor_dict(tensor_dict1: MutableMapping, tensor_dict2: Mapping) -> MutableMapping:
    """Add tensor_dict2's tensors to tensor_dict1 (a TensorBatch or TensorDict, in place; returned); batch
    sizes must match and shared keys hold equal tensors."""
    if tuple(tensor_dict1.batch_size) != tuple(tensor_dict2.batch_size):
        raise DataProtoError(f"union_tensor_dict: batch sizes differ ({tuple(tensor_dict1.batch_size)} vs "
                             f"{tuple(tensor_dict2.batch_size)})")
    for key in tensor_dict2.keys():  # noqa: SIM118 - TensorDict refuses `in` without .keys()
        value = tensor_dict2[key]
        if key in tensor_dict1.keys() and not deep_equal(tensor_dict1[key], value):  # noqa: SIM118
            raise DataProtoError(f"union_tensor_dict: `{key}` in tensor_dict1 and tensor_dict2 are not the same "
                                 f"object (their values differ)")
        tensor_dict1[key] = value
    return tensor_dict1


def union_numpy_dict(tensor_dict1: dict[str, np.ndarray], tensor_dict2: Mapping[str, np.ndarray]
                     ) -> dict[str, np.ndarray]:
    """Add tensor_dict2's arrays to tensor_dict1 (in place; returned); shared keys must hold equal arrays."""
    for key, value in tensor_dict2.items():
        if key in tensor_dict1:
            if not (isinstance(value, np.ndarray) and isinstance(tensor_dict1[key], np.ndarray)):
                raise DataProtoError(f"union_numpy_dict: `{key}` must be a numpy array in both dicts")
            if not deep_equal(tensor_dict1[key], value):
                raise DataProtoError(f"union_numpy_dict: `{key}` in tensor_dict1 and tensor_dict2 are not the "
                                     f"same object (their values differ)")
        tensor_dict1[key] = value
    return tensor_dict1


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
    """A (rows, L, ...) view of a column: N-d arrays as they are, a 1-d column of equal-length sequences as a
    (rows, L) object array."""
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


EncodedTensor = tuple[str, tuple[int, ...], np.ndarray]


def serialize_single_tensor(tensor: torch.Tensor) -> EncodedTensor:
    """(dtype name without "torch.", shape, uint8 numpy array of the contiguous bytes)."""
    raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), raw


def deserialize_single_tensor(encoded: EncodedTensor) -> torch.Tensor:
    dtype_name, shape, raw = encoded
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise DataProtoError(f"deserialize_single_tensor: {dtype_name!r} is not a torch dtype")
    buffer = bytearray(raw)  # a writable copy, so the tensor does not alias the transport's buffer
    flat = torch.frombuffer(buffer, dtype=torch.uint8) if buffer else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


def serialize_tensordict(batch: Any) -> tuple[tuple[int, ...], str | None, dict[str, tuple]]:
    """(batch_size, device or None, {key: encoded tensor}); a nested tensor is (layout, [encoded parts])."""
    items: dict[str, tuple] = {}
    for key, value in batch.items():
        if value.is_nested:
            parts = [serialize_single_tensor(part) for part in value.unbind()]
            items[key] = (str(value.layout).removeprefix("torch."), parts)
        else:
            items[key] = serialize_single_tensor(value)
    device = getattr(batch, "device", None)
    return tuple(batch.batch_size), None if device is None else str(device), items


def deserialize_tensordict(encoded: tuple) -> Any:
    """The TensorDict that serialize_tensordict encoded."""
    td = require_tensordict()
    batch_size, device, items = encoded
    tensors = {}
    for key, value in items.items():
        if len(value) == 3:
            tensors[key] = deserialize_single_tensor(value)
        elif len(value) == 2:
            layout, parts = value
            tensors[key] = torch.nested.as_nested_tensor([deserialize_single_tensor(p) for p in parts],
                                                         layout=getattr(torch, layout))
        else:
            raise DataProtoError(f"deserialize_tensordict: {key!r} is neither a tensor nor a nested tensor encoding")
    return td.TensorDict(tensors, batch_size=batch_size, device=device)


def to_tensordict(data: DataProto) -> Any:
    """Tensors as they are, each per-row column as a NonTensorStack, each meta_info value as NonTensorData."""
    td = require_tensordict()
    tensors = dict(data.batch.items()) if data.batch is not None else {}
    shared = set(tensors) & set(data.non_tensor_batch)
    if shared:
        raise DataProtoError(f"to_tensordict: keys {sorted(shared)} are in both batch and non_tensor_batch")
    source = {**tensors, **{k: non_tensor_stack(v) for k, v in data.non_tensor_batch.items()}}
    out = td.TensorDict(source, batch_size=[len(data)])
    for key, value in data.meta_info.items():
        if key in source:
            raise DataProtoError(f"to_tensordict: meta_info key {key!r} is also a column")
        out[key] = td.NonTensorData(value)
    return out


def from_tensordict(cls: type[DataProto], tensor_dict: Any, meta_info: dict | None = None,
                    num_batch_dims: int = 1) -> DataProto:
    """A DataProto (of class `cls`) from a TensorDict with one batch dimension (to_tensordict's inverse)."""
    td = require_tensordict()
    if num_batch_dims != 1:
        raise DataProtoError(f"from_tensordict: DataProto has one batch dimension, got num_batch_dims={num_batch_dims}")
    tensors, non_tensors, meta = {}, {}, dict(meta_info or {})
    for key, value in tensor_dict.items():
        if isinstance(value, td.NonTensorStack):
            non_tensors[key] = object_column(value.tolist())
        elif isinstance(value, td.NonTensorData):
            meta[key] = value.data
        elif isinstance(value, torch.Tensor):
            tensors[key] = value
        else:
            raise DataProtoError(f"from_tensordict: {key!r} is a {type(value).__name__}, not a tensor or "
                                 f"non-tensor data")
    return cls.from_dict(tensors or None, non_tensors, meta)


# ---------------------------------------------------------------- verl.utils.tensordict_utils


def get_tensordict(tensor_dict: Mapping[str, Any], non_tensor_dict: Mapping[str, Any] | None = None):
    """A TensorDict with one batch dimension from per-row columns (`tensor_dict`: tensors, or lists with one
    entry per row) and batch-wide values (`non_tensor_dict`, stored as NonTensorData)."""
    td = require_tensordict()
    rows = {len(value) for value in tensor_dict.values()}
    if len(rows) > 1:
        raise ValueError(f"get_tensordict: columns disagree on the number of rows: {sorted(rows)}")
    source = {key: value if isinstance(value, torch.Tensor) else non_tensor_stack(value)
              for key, value in tensor_dict.items()}
    out = td.TensorDict(source, batch_size=[rows.pop()] if rows else [])
    for key, value in (non_tensor_dict or {}).items():
        if key in out.keys():  # noqa: SIM118 - TensorDict refuses `in` without .keys()
            raise ValueError(f"get_tensordict: {key!r} is both a column and a batch-wide value")
        out[key] = td.NonTensorData(value)
    return out
