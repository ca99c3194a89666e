"""Algorithm settings from plain keywords (`clip_ratio=0.2`) or a verl-style `config` object; a setting
given both ways with different values raises rather than train with one the caller did not mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Number
from typing import Any

_MISSING = object()

# Actor-config fields that policy losses read, and those that live under `policy_loss`.
ACTOR_LOSS_FIELDS = ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "tau_pos", "tau_neg")
POLICY_LOSS_FIELDS = ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "dro_beta",
                      "topr_negative_ratio_lower", "topr_negative_ratio_upper")


def _lookup(config: Any, name: str) -> Any:
    """config.name for dataclasses / OmegaConf nodes, config[name] for dicts; _MISSING when absent."""
    if isinstance(config, Mapping):
        return config.get(name, _MISSING)
    return getattr(config, name, _MISSING)


def check_config_object(config: Any, owner: str) -> None:
    """Reject a number where verl's config object goes (an old positional call such as f(r, m, 0.99))."""
    if isinstance(config, Number):
        raise TypeError(
            f"{owner}: got the number {config!r} as `config`; pass settings by keyword (e.g. gamma={config!r}) "
            f"or a config object with those fields"
        )


def config_value(config: Any, name: str, explicit: Any, owner: str) -> Any:
    """The setting `name`: the explicit keyword if given, else `config.<name>`; raises if neither has it."""
    value = optional_config_value(config, name, explicit, owner)
    if value is None:
        raise ValueError(f"{owner} needs `{name}`: pass {name}=... or a config with a `{name}` field")
    return value


def optional_config_value(config: Any, name: str, explicit: Any, owner: str) -> Any:
    """As `config_value`, but a setting found in neither place is None."""
    check_config_object(config, owner)
    from_config = None if config is None else _lookup(config, name)
    if from_config is _MISSING:
        from_config = None
    if explicit is not None and from_config is not None and from_config != explicit:
        raise ValueError(f"{owner}: {name}={explicit!r} was passed but config.{name} is {from_config!r}")
    return explicit if explicit is not None else from_config


def policy_loss_settings(config: Any) -> dict[str, Any]:
    """The policy losses' keyword settings from an actor config (hybridrl's, verl's, or OmegaConf), with
    verl's `global_batch_info` (the mini-batch totals) when present."""
    settings = {}
    for name in ACTOR_LOSS_FIELDS:
        value = _lookup(config, name)
        if value is not _MISSING:
            settings[name] = value
    policy_loss = _lookup(config, "policy_loss")
    if policy_loss not in (_MISSING, None):
        for name in POLICY_LOSS_FIELDS:
            value = _lookup(policy_loss, name)
            if value is not _MISSING:
                settings[name] = value
    batch_info = _lookup(config, "global_batch_info")
    if batch_info not in (_MISSING, None) and len(batch_info):
        settings["global_batch_info"] = dict(batch_info)
    return settings


def merge_config_settings(config: Any, explicit: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """Settings from `config` overlaid with explicit keywords; a disagreement between the two raises."""
    check_config_object(config, owner)
    merged = policy_loss_settings(config)
    for name, value in explicit.items():
        if name in merged and merged[name] is not None and value is not None and merged[name] != value:
            raise ValueError(f"{owner}: {name}={value!r} was passed but the config says {merged[name]!r}")
        merged[name] = value
    return merged
