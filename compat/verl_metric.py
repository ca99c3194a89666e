"""verl's `verl.utils.metric` and `verl.utils.py_functional` names over hybridrl.utils.metric, for code and
tests written against verl: `Metric`, values that carry their own aggregation, `append_to_dict`, which
collects them, a `reduce_metrics` that reduces a `Metric` by its aggregation and anything else as the
core's does, and `marked_timer`, verl's signature of `timer`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from enum import Enum
from typing import Any

import numpy as np
import torch

from hybridrl.utils import metric as core
from hybridrl.utils.metric import *  # noqa: F403 - verl's metric modules hold the core's names
from hybridrl.utils.metric import timer


class AggregationType(str, Enum):
    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


class Metric:
    """Values of one metric with their reduction (`aggregate()`), for values `reduce_metrics` must not average:
    e.g. a micro-batch loss already divided by the mini-batch's token count is a SUM."""

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


def reduce_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """One number per key: a `Metric` by its aggregation, anything else as hybridrl's `reduce_metrics`."""
    plain = core.reduce_metrics({key: values for key, values in metrics.items() if not isinstance(values, Metric)})
    return {key: values.aggregate() if isinstance(values, Metric) else plain[key]
            for key, values in metrics.items()}


def append_to_dict(data: MutableMapping[str, Any], new_data: Mapping[str, Any], prefix: str = "") -> None:
    """Append new_data's values to data's lists (or Metrics) in place, extending with list values; `prefix` is
    put before keys that lack it."""
    for key, value in new_data.items():
        name = key if key.startswith(prefix) else f"{prefix}{key}"
        if name not in data:
            data[name] = value.init_list() if isinstance(value, Metric) else []
        if isinstance(value, list):
            data[name].extend(value)
        else:
            data[name].append(value)


@contextmanager
def marked_timer(
    name: str, timing_raw: MutableMapping[str, float], color: str | None = None
) -> Iterator[None]:
    """verl's signature for `timer`; `color` (an NVTX colour there) is ignored."""
    del color
    with timer(name, timing_raw):
        yield
