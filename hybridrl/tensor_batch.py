"""TensorBatch: the `batch` half of `DataProto`, tensors sharing their leading (batch) dimension; what verl
uses `tensordict.TensorDict` for, without its tight torch pin."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch

RowIndex = int | slice | Sequence[int] | np.ndarray | torch.Tensor


def _as_index(index: RowIndex) -> int | slice | torch.Tensor:
    """A row index `tensor[index]` reads the same way for every key; index tensors live on the CPU (numpy
    columns are indexed with them too)."""
    if isinstance(index, (int, np.integer)):
        return int(index)
    if isinstance(index, slice):
        return index
    if isinstance(index, torch.Tensor):
        return index.cpu() if index.dtype == torch.bool else index.long().cpu()
    array = np.asarray(index)
    if array.dtype == bool:
        return torch.from_numpy(array)
    if array.size == 0:
        return torch.zeros(0, dtype=torch.long, device="cpu")
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"row indices must be integers or booleans, got dtype {array.dtype}")
    return torch.from_numpy(array.astype(np.int64))


class TensorBatch(Mapping[str, torch.Tensor]):
    """Tensors keyed by name, all with the same size along dim 0."""

    def __init__(self, tensors: Mapping[str, torch.Tensor] | None = None, batch_size: int | None = None):
        """`tensors`: a dict, a TensorBatch or a tensordict.TensorDict (whose row count is kept even when empty)."""
        self._tensors: dict[str, torch.Tensor] = {}
        if batch_size is None and hasattr(tensors, "batch_size"):
            dims = tuple(tensors.batch_size)
            if len(dims) != 1:
                raise ValueError(f"a batch has one batch dimension; got batch_size {dims} (fold rows instead)")
            batch_size = int(dims[0])
        self._batch_size = batch_size
        # `is not None`, not truthiness: a TensorDict refuses to be read as a bool
        for key, value in (tensors.items() if tensors is not None else ()):
            self[key] = value
        if self._batch_size is None:
            self._batch_size = 0

    def __getitem__(self, key: str) -> torch.Tensor:
        try:
            return self._tensors[key]
        except KeyError:
            raise KeyError(f"no tensor {key!r} in batch; keys are {sorted(self._tensors)}") from None

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        if not isinstance(key, str):
            raise TypeError(f"batch keys must be strings, got {key!r}")
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"batch[{key!r}] must be a torch.Tensor, got {type(value).__name__}")
        if value.dim() == 0:
            raise ValueError(f"batch[{key!r}] is a scalar; batch tensors need a leading batch dimension")
        if self._batch_size is None or (not self._tensors and self._batch_size == 0):
            self._batch_size = value.shape[0]
        elif value.shape[0] != self._batch_size:
            raise ValueError(
                f"batch[{key!r}] has {value.shape[0]} rows but the batch has {self._batch_size} "
                f"(keys: {sorted(self._tensors)})"
            )
        self._tensors[key] = value

    def __delitem__(self, key: str) -> None:
        del self._tensors[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}: {tuple(v.shape)} {v.dtype}" for k, v in self._tensors.items())
        return f"TensorBatch(batch_size={self._batch_size}, {{{fields}}})"

    @property
    def batch_size(self) -> torch.Size:
        """`torch.Size([rows])`, as tensordict reports it."""
        return torch.Size([self._batch_size])

    @property
    def num_rows(self) -> int:
        return self._batch_size

    def pop(self, key: str) -> torch.Tensor:  # type: ignore[override]
        tensor = self[key]
        del self._tensors[key]
        return tensor

    def rows(self, index: RowIndex) -> TensorBatch:
        """Rows picked by an int, slice, integer array or boolean mask; an int keeps a batch of one."""
        idx = _as_index(index)
        if isinstance(idx, int):
            if not -self._batch_size <= idx < self._batch_size:
                raise IndexError(f"row {idx} out of range for a batch of {self._batch_size}")
            idx = slice(idx, idx + 1 if idx != -1 else None)
        picked = {key: value[idx] for key, value in self._tensors.items()}
        if picked:
            return TensorBatch(picked)
        return TensorBatch(batch_size=torch.arange(self._batch_size, device="cpu")[idx].numel())

    def select(self, keys: Iterable[str]) -> TensorBatch:
        return TensorBatch({key: self[key] for key in keys}, batch_size=self._batch_size)

    def to(self, device: str | torch.device) -> TensorBatch:
        return TensorBatch({k: v.to(device) for k, v in self._tensors.items()}, batch_size=self._batch_size)

    def clone(self) -> TensorBatch:
        return TensorBatch({k: v.clone() for k, v in self._tensors.items()}, batch_size=self._batch_size)

    @staticmethod
    def cat(batches: Sequence[TensorBatch]) -> TensorBatch:
        """Concatenate along rows; every batch must carry the same keys."""
        if not batches:
            raise ValueError("cannot concatenate an empty list of batches")
        keys = list(batches[0].keys())
        for i, b in enumerate(batches[1:], start=1):
            if set(b.keys()) != set(keys):
                raise ValueError(
                    f"batch {i} has keys {sorted(b.keys())} but batch 0 has {sorted(keys)}; "
                    f"select the same keys before concatenating"
                )
        total = sum(b.num_rows for b in batches)
        return TensorBatch({k: torch.cat([b[k] for b in batches], dim=0) for k in keys}, batch_size=total)

    def __getstate__(self) -> dict:
        # numpy buffers travel out of band in pickle protocol 5 (Ray); bfloat16, which numpy lacks, as int16 bits
        arrays = {}
        for key, value in self._tensors.items():
            value = value.detach().cpu().contiguous()
            if value.dtype == torch.bfloat16:
                arrays[key] = ("bfloat16", value.view(torch.int16).numpy())
            else:
                arrays[key] = (None, value.numpy())
        return {"arrays": arrays, "batch_size": self._batch_size}

    def __setstate__(self, state: dict) -> None:
        self._tensors = {}
        self._batch_size = state["batch_size"]
        for key, (special, array) in state["arrays"].items():
            # Arrays that arrive read-only (Ray's object store) are copied once so tensors stay writable.
            tensor = torch.from_numpy(array if array.flags.writeable else array.copy())
            self._tensors[key] = tensor.view(torch.bfloat16) if special == "bfloat16" else tensor
