"""Building `tensordict.TensorDict`s for code that exchanges them (verl's TensorDict-based interfaces).

hybridrl itself does not depend on tensordict (its `TensorBatch` does the batch work); the functions
here import it when called and say how to install it when it is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

import torch


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


def get_tensordict(tensor_dict: Mapping[str, Any], non_tensor_dict: Mapping[str, Any] | None = None):
    """A TensorDict with one batch dimension from per-row columns and per-batch values.

    tensor_dict: tensors (rows, ...) and per-row Python values (lists or arrays, one entry per row);
    non_tensor_dict: values for the whole batch (verl's meta_info), stored as NonTensorData.
    """
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
