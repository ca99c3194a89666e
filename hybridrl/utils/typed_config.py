"""Typed configs: build a dataclass from a dict or an OmegaConf node with OmegaConf's checks, and find
keys a `+` override added beyond the schema."""

from __future__ import annotations

import dataclasses
import difflib
from numbers import Number
from typing import Any, TypeVar

from omegaconf import OmegaConf

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting, or a combination of settings, that cannot work."""


def require(ok: bool, message: str) -> None:
    """Raise ConfigError(message) unless `ok`."""
    if not ok:
        raise ConfigError(message)


def require_config_object(config: Any, owner: str, expected: str) -> None:
    """Raise unless `config` is a config object: None, or a number from an old positional call such as
    f(rewards, mask, 0.99), names what `owner` expects there."""
    if config is None or isinstance(config, Number):
        raise TypeError(f"{owner} reads its settings from `config`, {expected}; got {config!r}")


def as_override(value: Any) -> str:
    """`value` as a Hydra command line writes it: null, true/false, [a,b], or the value itself."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(as_override(item) for item in value) + "]"
    return str(value)


def to_dataclass(cls: type[T], value: Any) -> T:
    """A `cls` instance from an instance, a dict or an OmegaConf node; unknown keys and wrong types raise with
    the key's path."""
    if isinstance(value, cls):
        return value
    merged = OmegaConf.merge(OmegaConf.structured(cls), value if value is not None else {})
    return OmegaConf.to_object(merged)


def added_keys(obj: Any, prefix: str = "") -> list[tuple[str, list[str]]]:
    """Keys a dataclass tree carries beyond its fields, each with its node's fields: Hydra's `+key=value` sets
    them as attributes nothing reads. Dict-typed fields (override_config, ...) stay open."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return []
    names = [f.name for f in dataclasses.fields(obj)]
    found = [(f"{prefix}{key}", names) for key in vars(obj) if key not in names]
    for name in names:
        found += added_keys(getattr(obj, name), f"{prefix}{name}.")
    return found


def unknown_key_message(key: str, known: list[str]) -> str:
    """`key` is not a setting: the message suggests the closest known key, or lists the node's keys."""
    parent, _, name = key.rpartition(".")
    where = f"{parent}." if parent else ""
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {where}{close[0]}?" if close else f"{parent or 'the top level'} has: {', '.join(known)}."
    return (f"unknown config key {key}, which a `+key=value` override added but nothing reads; {hint} "
            f"Fix the name, and drop the `+` when setting a key the schema has")
