"""`@register`: how a worker method is split across ranks, run, and its results merged (docs/architecture.md,
"Worker groups and dispatch")."""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from hybridrl.protocol import DataProto, pad_dataproto_to_divisor
from hybridrl.utils.cpu_threads import fit_cpu_threads
from hybridrl.utils.registry import Registry


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
    """What one rank receives for a DataProto argument of a DP_COMPUTE_PROTO call: `data` (its chunk, whose
    rows past `real_rows` are padding) or `futures` (a previous call's outputs, which the rank fetches and cuts)."""

    data: DataProto | None = None
    real_rows: int | None = None
    futures: list | None = None
    rank: int = 0
    world_size: int = 1

    def materialize(self) -> DataProto:
        if self.data is None:
            whole = DataProto.concat(resolve(self.futures))
            self.data, self.real_rows = rank_chunks(whole, self.world_size)[self.rank]
        return self.data


def rank_chunks(data: DataProto, world_size: int) -> list[tuple[DataProto, int]]:
    """Each rank's chunk of `data` (padded to divide by `world_size`) and its count of real, not padding, rows."""
    padded, _ = pad_dataproto_to_divisor(data, world_size)
    chunks = padded.chunk(world_size)
    rows = len(chunks[0])
    return [(chunk, max(0, min(rows, len(data) - r * rows))) for r, chunk in enumerate(chunks)]


def trim_padding(output: Any, shard: ProtoShard) -> Any:
    """Drop the outputs of this rank's padding rows: the last k * padding rows, for a method that returns k
    rows per input row (e.g. k samples per prompt)."""
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


class Dispatch(str, Enum):
    """Built-in ways to split a call's arguments across the ranks of a group."""

    ONE_TO_ALL = "ONE_TO_ALL"  # every rank gets the same arguments; result: list per rank
    ALL_TO_ALL = "ALL_TO_ALL"  # each argument is already a per-rank list; result: list per rank
    RANK_ZERO = "RANK_ZERO"  # only rank 0 runs; result: rank 0's output
    DP_COMPUTE = "DP_COMPUTE"  # like ALL_TO_ALL, for data-parallel pre-split inputs
    DP_COMPUTE_PROTO = "DP_COMPUTE_PROTO"  # DataProto chunked by rank (padded); outputs concatenated
    DP_COMPUTE_PROTO_WITH_FUNC = "DP_COMPUTE_PROTO_WITH_FUNC"  # first arg (a function) to all, rest as above
    DP_COMPUTE_METRIC = "DP_COMPUTE_METRIC"  # DataProto chunked by rank; result: list of per-rank outputs


class Execute(str, Enum):
    ALL = "ALL"
    RANK_ZERO = "RANK_ZERO"


@dataclass(frozen=True)
class DispatchMode:
    """dispatch_fn(wg, *args, **kwargs) -> (args, kwargs) of per-rank lists; collect_fn(wg, outputs) -> the
    caller's value (verl's signatures); a non-blocking call of a concatenates_protos mode returns a future."""

    name: str
    dispatch_fn: Callable[..., tuple[tuple, dict]]
    collect_fn: Callable[[Any, list], Any]
    concatenates_protos: bool = False


DISPATCH_MODES: Registry[DispatchMode] = Registry("dispatch mode")


def register_dispatch_mode(name: str, dispatch_fn: Callable, collect_fn: Callable) -> DispatchMode:
    """Add a custom dispatch mode; use it as `@register(dispatch_mode="name")`."""
    mode = DispatchMode(name, dispatch_fn, collect_fn)
    DISPATCH_MODES.add(name, mode)
    return mode


def get_dispatch_mode(mode: Dispatch | str | dict | DispatchMode) -> DispatchMode:
    if isinstance(mode, DispatchMode):
        return mode
    if isinstance(mode, dict):  # verl's inline form: {"dispatch_fn": ..., "collect_fn": ...}
        return DispatchMode("custom", mode["dispatch_fn"], mode["collect_fn"])
    return DISPATCH_MODES.get(mode.value if isinstance(mode, Dispatch) else mode)


# ----- built-in dispatch and collect functions ---------------------------------------------------------
def _broadcast(wg, *args, **kwargs) -> tuple[tuple, dict]:
    n = wg.world_size
    return tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}


def _pass_through(wg, *args, **kwargs) -> tuple[tuple, dict]:
    for name, value in [*((f"argument {i}", a) for i, a in enumerate(args)), *kwargs.items()]:
        if not isinstance(value, (list, tuple)) or len(value) != wg.world_size:
            raise ValueError(
                f"{name} must be a list with one entry per rank ({wg.world_size}) for this dispatch mode, "
                f"got {type(value).__name__}"
                + (f" of length {len(value)}" if isinstance(value, (list, tuple)) else "")
            )
    return args, kwargs


def _collect_list(wg, outputs: list) -> list:
    return list(outputs)


def _shard_proto(value: Any, world_size: int) -> list:
    """Per-rank shards of a DataProto (padded to divide) or a DataProtoFuture; other values broadcast."""
    if isinstance(value, DataProto):
        return [ProtoShard(data=chunk, real_rows=real) for chunk, real in rank_chunks(value, world_size)]
    if isinstance(value, DataProtoFuture):
        return [ProtoShard(futures=value.futures, rank=r, world_size=world_size) for r in range(world_size)]
    return [value] * world_size


def _dispatch_proto(wg, *args, **kwargs) -> tuple[tuple, dict]:
    protos = [v for v in (*args, *kwargs.values()) if isinstance(v, DataProto)]
    if len({len(p) for p in protos}) > 1:
        raise ValueError(f"DataProto arguments of one call must have equal lengths, got {[len(p) for p in protos]}")
    n = wg.world_size
    return tuple(_shard_proto(a, n) for a in args), {k: _shard_proto(v, n) for k, v in kwargs.items()}


def _dispatch_proto_with_func(wg, func, *args, **kwargs) -> tuple[tuple, dict]:
    if not callable(func):
        raise TypeError("DP_COMPUTE_PROTO_WITH_FUNC expects a function as the first argument")
    args, kwargs = _dispatch_proto(wg, *args, **kwargs)
    return ([func] * wg.world_size, *args), kwargs


def _collect_proto(wg, outputs: list) -> Any:
    return DataProto.concat(outputs) if all(isinstance(o, DataProto) for o in outputs) else list(outputs)


for _mode, _dispatch, _collect in [
    (Dispatch.ONE_TO_ALL, _broadcast, _collect_list),
    (Dispatch.ALL_TO_ALL, _pass_through, _collect_list),
    (Dispatch.RANK_ZERO, _broadcast, _collect_list),
    (Dispatch.DP_COMPUTE, _pass_through, _collect_list),
    (Dispatch.DP_COMPUTE_PROTO, _dispatch_proto, _collect_proto),
    (Dispatch.DP_COMPUTE_PROTO_WITH_FUNC, _dispatch_proto_with_func, _collect_proto),
    (Dispatch.DP_COMPUTE_METRIC, _dispatch_proto, _collect_list),
]:
    DISPATCH_MODES.add(_mode.value, DispatchMode(_mode.value, _dispatch, _collect,
                                                 concatenates_protos=_collect is _collect_proto))


# ----- device placement --------------------------------------------------------------------------------
CPU = torch.device("cpu")


def on_device(data: DataProto, device: torch.device) -> DataProto:
    """`data` with its batch on `device`: `data` where it is there already, else a moved shallow copy."""
    if data.batch is None or all(t.device == device for t in data.batch.values()):
        return data
    return copy.copy(data).to(device)


def to_cpu(value: Any) -> Any:
    """A method's result with its tensors (also in a list, tuple or dict) on the CPU; unmoved values as they are."""
    if isinstance(value, DataProto):
        return on_device(value, CPU)
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if type(value) in (list, tuple):
        moved = [to_cpu(v) for v in value]
        return value if all(m is v for m, v in zip(moved, value, strict=True)) else type(value)(moved)
    if type(value) is dict:
        moved = {k: to_cpu(v) for k, v in value.items()}
        return value if all(moved[k] is v for k, v in value.items()) else moved
    return value


def _open_arg(value: Any, device: torch.device | None) -> Any:
    """One argument as the worker method sees it: shards and futures fetched, a DataProto on `device`."""
    if isinstance(value, ProtoShard):
        value = value.materialize()
    elif isinstance(value, DataProtoFuture):
        value = value.get()
    return on_device(value, device) if device is not None and isinstance(value, DataProto) else value


# ----- the decorator -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class MethodSpec:
    """What `@register` records on a worker method."""

    dispatch_mode: Dispatch | str | dict | DispatchMode
    execute_mode: Execute
    blocking: bool


_SPEC_ATTR = "hybridrl_method_spec"


def register(
    dispatch_mode: Dispatch | str | dict | DispatchMode = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
) -> Callable[[Callable], Callable]:
    """Mark a worker method as callable from a WorkerGroup: on the worker, its DataProto arguments come fetched
    and on its `device`, torch threads are fitted (`fit_cpu_threads`), and the result returns on the CPU."""
    mode = get_dispatch_mode(dispatch_mode)  # fail at class definition for an unknown mode
    if dispatch_mode == Dispatch.RANK_ZERO:
        execute_mode = Execute.RANK_ZERO
    if Execute(execute_mode) is Execute.RANK_ZERO and mode.concatenates_protos:
        raise ValueError(f"dispatch mode {dispatch_mode} splits a batch among all ranks, but execute_mode=RANK_ZERO "
                         "runs rank 0 only: the other ranks' shares would be lost; use Dispatch.ONE_TO_ALL")
    spec = MethodSpec(dispatch_mode, Execute(execute_mode), blocking)

    def decorator(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(self, *args, **kwargs):
            device = getattr(self, "device", None)
            shards = [a for a in (*args, *kwargs.values()) if isinstance(a, ProtoShard)]
            args = tuple(_open_arg(a, device) for a in args)
            kwargs = {k: _open_arg(v, device) for k, v in kwargs.items()}
            fit_cpu_threads()
            output = func(self, *args, **kwargs)
            return to_cpu(trim_padding(output, shards[0]) if shards else output)

        setattr(wrapper, _SPEC_ATTR, spec)
        return wrapper

    return decorator


def get_method_spec(func: Any) -> MethodSpec | None:
    return getattr(func, _SPEC_ATTR, None)


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    """Every `@register`-ed method of `cls` and its bases, by name (subclass definitions win)."""
    methods: dict[str, MethodSpec] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            spec = get_method_spec(value)
            if spec is not None:
                methods[name] = spec
            elif name in methods:  # overridden without @register: no longer remote-callable
                del methods[name]
    return methods
