"""Merging the parts of DataProtos: equality with NaN and nesting, unions, and concat's meta_info; and
`object_column`, the one way a list of per-row values becomes a non-tensor column.

Two DataProtos that both carry a key must agree on its value, otherwise the merge raises naming the
key: silently keeping one of two different `old_log_probs` would corrupt training. `DataProtoError`
is both a ValueError (what hybridrl code catches) and an AssertionError (what verl raises for the same
mistakes, so code written against verl keeps catching it).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np
import torch


class DataProtoError(ValueError, AssertionError):
    """Inconsistent or conflicting DataProto contents (see the module docstring for the two bases)."""


def object_column(values: Sequence[Any]) -> np.ndarray:
    """A 1-d object array with one entry per value, filled element-wise so that equal-length lists (or
    dicts) stay one Python object per row instead of becoming extra numpy dimensions."""
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        column[i] = value
    return column


def _is_nan(value: Any) -> bool:
    return isinstance(value, (float, np.floating)) and bool(np.isnan(value))


def deep_equal(a: Any, b: Any, _seen: set[tuple[int, int]] | None = None) -> bool:
    """Value equality through numpy arrays, lists, tuples and dicts, where NaN equals NaN.

    Self-referencing containers compare equal when their shapes of reference match (a pair already
    being compared further up counts as equal), so a cycle cannot recurse forever.
    """
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


def union_tensor_dict(tensor_dict1: MutableMapping, tensor_dict2: Mapping) -> MutableMapping:
    """Add tensor_dict2's tensors to tensor_dict1 (in place; returned) -- TensorBatch or TensorDict.

    Both must have the same batch size; a key in both must hold equal tensors.
    """
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


def _metric_dicts(value: Any) -> list[Mapping[str, Any]]:
    """A worker's `metrics`: one dict, or a list of dicts (one per micro-batch or step)."""
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) else [value]
    for item in items:
        if not isinstance(item, Mapping):
            raise DataProtoError(f"meta_info['metrics'] must be a dict or a list of dicts, got {type(item).__name__}")
    return list(items)


def merge_meta_info(metas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """meta_info of DataProtos concatenated from several workers.

    `metrics` from every worker are gathered into one dict of lists ({"loss": [rank0, rank1, ...]});
    a worker's own list of values for a key is extended, not nested, so each key stays a flat list.
    Every other key must hold the same value in each part that has it: a setting that differs between
    ranks is an error, not something to resolve by keeping the first.
    """
    merged: dict[str, Any] = {}
    gathered: dict[str, list[Any]] = {}
    for meta in metas:
        for key, value in meta.items():
            if key == "metrics":
                for metrics in _metric_dicts(value):
                    for name, metric in metrics.items():
                        values = gathered.setdefault(name, [])
                        if isinstance(metric, list):
                            values.extend(metric)
                        else:
                            values.append(metric)
            elif key in merged and not deep_equal(merged[key], value):
                raise DataProtoError(f"Conflicting values for meta_info key '{key}' across the concatenated "
                                     f"DataProtos: {merged[key]!r} vs {value!r}")
            else:
                merged.setdefault(key, value)
    if gathered:
        merged["metrics"] = gathered
    return merged
