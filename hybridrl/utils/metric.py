"""Reducing the lists of metric values that workers report to one number per metric.

A worker reports each metric once per micro-batch or mini-batch (and concat gathers the ranks'
reports), so a metric arrives as a list. `reduce_metrics` takes the mean, or the max / min for keys
named so. A value that must be summed instead -- a loss already divided by the whole mini-batch's
token count, whose micro-batch parts add up to the mini-batch loss -- travels as a `Metric` that
carries its own aggregation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, MutableMapping
from enum import Enum
from typing import Any

import numpy as np
import torch


class AggregationType(str, Enum):
    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


class Metric:
    """Values of one metric together with how to reduce them (`aggregate()`)."""

    def __init__(self, aggregation: str | AggregationType, value: Any = None) -> None:
        self.aggregation = AggregationType(aggregation)  # raises on an unknown name
        self.values: list[float] = []
        if isinstance(value, (list, tuple, Metric)):
            self.extend(value)
        elif value is not None:
            self.append(value)

    def __repr__(self) -> str:
        return f"Metric({self.aggregation.value}, {self.values})"

    def append(self, value: Any) -> None:
        if isinstance(value, Metric):
            self.extend(value)
            return
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"a metric value must be a scalar, got a tensor of shape {tuple(value.shape)}")
            value = value.detach().item()
        if not isinstance(value, (int, float, np.number)):
            raise TypeError(f"a metric value must be a number, got {type(value).__name__}")
        self.values.append(float(value))

    def extend(self, values: Metric | Iterable[Any]) -> None:
        if isinstance(values, Metric):
            if values.aggregation != self.aggregation:
                raise ValueError(f"cannot merge a {values.aggregation.value} metric into a {self.aggregation.value} one")
            values = values.values
        for value in values:
            self.append(value)

    def init_list(self) -> Metric:
        """An empty Metric with the same aggregation (what append_to_dict starts a key with)."""
        return Metric(self.aggregation)

    def aggregate(self) -> float:
        if not self.values:
            return math.nan
        reduce = {AggregationType.MEAN: np.mean, AggregationType.SUM: np.sum,
                  AggregationType.MIN: np.min, AggregationType.MAX: np.max}[self.aggregation]
        return float(reduce(self.values))


def _reduction(key: str) -> str:
    tokens = key.rsplit("/", 1)[-1].split("_")
    return "max" if "max" in tokens else "min" if "min" in tokens else "mean"


def reduce_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """One number per key from the per-micro-batch (or per-rank) lists the workers return.

    A `Metric` reduces by its own aggregation. A plain list takes the mean, except for keys whose last
    path segment has a `max` or `min` word (`response_length/max`, `perf/max_memory_rss_gb`), which
    take the max or min, as newer verl does: the mean of per-rank maxima is not a maximum. An empty
    list gives NaN (nothing was measured).
    """
    reduced = {}
    for key, values in metrics.items():
        if isinstance(values, Metric):
            reduced[key] = values.aggregate()
            continue
        array = np.asarray(values if isinstance(values, (list, tuple, np.ndarray)) else [values], float)
        if array.size == 0:
            reduced[key] = math.nan
            continue
        reduced[key] = float(getattr(np, _reduction(key))(array))
    return reduced


def append_to_dict(data: MutableMapping[str, Any], new_data: Mapping[str, Any], prefix: str = "") -> None:
    """Append each of new_data's values to the list (or Metric) under the same key in data, in place.

    A list value is extended rather than nested. `prefix` is put before keys that do not have it yet.
    """
    for key, value in new_data.items():
        name = key if key.startswith(prefix) else f"{prefix}{key}"
        if name not in data:
            data[name] = value.init_list() if isinstance(value, Metric) else []
        if isinstance(value, list):
            data[name].extend(value)
        else:
            data[name].append(value)
