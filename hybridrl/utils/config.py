"""Typed configs: build a dataclass from a dict or an OmegaConf node, with OmegaConf's checks."""

from __future__ import annotations

from typing import Any, TypeVar

from omegaconf import OmegaConf

T = TypeVar("T")


def to_dataclass(cls: type[T], value: Any) -> T:
    """A `cls` instance from an instance, a dict or an OmegaConf node, type-checked by OmegaConf.

    Unknown keys and values of the wrong type raise with the key's full path in the message.
    """
    if isinstance(value, cls):
        return value
    merged = OmegaConf.merge(OmegaConf.structured(cls), value if value is not None else {})
    return OmegaConf.to_object(merged)
