"""Typed configs: build a dataclass from a dict or an OmegaConf node with OmegaConf's checks, find keys a
`+` override added beyond the schema, and freeze a resolved config so that nothing writes into it."""

from __future__ import annotations

import dataclasses
import difflib
from numbers import Number
from typing import Any, TypeVar

from omegaconf import OmegaConf

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting, or a combination of settings, that cannot work."""


FROZEN_AT = "_frozen_at"  # a frozen node's dotted key, so that an assignment names the key


class FreezableConfig:
    """Base of the config dataclasses: mutable as built (verl's tests and scripts build and change them),
    read-only once `freeze` has run over the tree."""

    # a slot, not an entry of __dict__: `vars(node)` stays the node's keys, and pickling carries it
    __slots__ = (FROZEN_AT,)

    def __setattr__(self, name: str, value: Any) -> None:
        _refuse_if_frozen(self, name)
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        _refuse_if_frozen(self, name)
        super().__delattr__(name)


def _refuse_if_frozen(node: FreezableConfig, name: str) -> None:
    where = getattr(node, FROZEN_AT, None)
    if where is not None:
        raise dataclasses.FrozenInstanceError(
            f"{where}{name} is read-only: the config was resolved and frozen before the run started. Set the key "
            f"on the command line, or compute a per-rank value from the config without writing it back "
            f"(dataclasses.replace makes a changed copy)")


def freeze(config: T, key: str = "") -> T:
    """Make `config` and every config node under it (each a FreezableConfig) read-only, in place; returns it."""
    if not isinstance(config, FreezableConfig) or not dataclasses.is_dataclass(config):
        raise TypeError(f"{key or 'the config'} ({type(config).__name__}) cannot be frozen: make it a dataclass "
                        f"deriving from FreezableConfig")
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            freeze(value, f"{key}{f.name}.")
    object.__setattr__(config, FROZEN_AT, key)
    return config


def require(ok: bool, message: str) -> None:
    """Raise ConfigError(message) unless `ok`."""
    if not ok:
        raise ConfigError(message)


def require_config_object(config: Any, owner: str, expected: str) -> None:
    """Raise, naming what `owner` expects, where `config` is None or a number (an old positional call such as
    f(rewards, mask, 0.99))."""
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
    """A `cls` instance from an instance, dict or OmegaConf node; unknown keys and wrong types raise with the path."""
    if isinstance(value, cls):
        return value
    merged = OmegaConf.merge(OmegaConf.structured(cls), value if value is not None else {})
    return OmegaConf.to_object(merged)


def readonly_view(config: Any) -> Any:
    """`config` (a dataclass) as a read-only DictConfig, as verl hands its sections to user classes."""
    view = OmegaConf.structured(config)
    OmegaConf.set_readonly(view, True)
    return view


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
