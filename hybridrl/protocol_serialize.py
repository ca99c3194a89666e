"""Converting DataProtos and tensors to and from plain buffers and TensorDicts.

- `serialize_single_tensor` / `deserialize_single_tensor`: a tensor as (dtype name, shape, raw bytes),
  which any transport can carry without torch's pickler (bfloat16 and float8 included).
- `serialize_tensordict` / `deserialize_tensordict`: the same for a batch of tensors, nested (ragged)
  tensors included; the batch may be a `TensorBatch` or a TensorDict, the result is a TensorDict.
- `to_tensordict` / `from_tensordict`: a DataProto as a TensorDict (per-row values as NonTensorStack,
  meta_info as NonTensorData) and back, for code that exchanges TensorDicts.

The TensorDict functions need the optional package tensordict; the tensor functions do not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hybridrl.protocol_merge import DataProtoError, object_column
from hybridrl.utils.tensordict_utils import non_tensor_stack, require_tensordict

if TYPE_CHECKING:
    from hybridrl.protocol import DataProto

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
