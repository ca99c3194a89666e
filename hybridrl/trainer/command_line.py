"""verl's command lines for the Hydra entry points, read as verl reads them (`verl_overrides`: verl's scripts
write `+key` where verl's schema lacks a key hybridrl's has, and shell lines ending in `\\ ` pass blank
arguments), a user's YAML extending `ppo_trainer` (`HybridrlConfigSearchPath`), and a run's local paths made
absolute on the driver (`make_paths_absolute`). verl's `ppo_megatron_trainer` config is hybridrl's with
`strategy: megatron`, which stops the run as a Megatron key on the command line does (MISSING_FEATURES).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from hydra.core.config_search_path import ConfigSearchPath, SearchPathQuery
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import DictConfig, ListConfig, OmegaConf

from hybridrl.utils.typed_config import ConfigError

logger = logging.getLogger(__name__)

CONFIG_DIR = "pkg://hybridrl.trainer.config"


def declares(node: Any, key: str) -> bool:
    """Whether `key` (dotted) is a field of the config `node`, not an entry of one of its dicts: a field of a
    structured section, or a key of a section marked struct (a YAML's fixed keys)."""
    parent, _, name = key.rpartition(".")
    holder = OmegaConf.select(node, parent, default=None) if parent else node
    fixed = OmegaConf.is_config(holder) and (OmegaConf.get_type(holder) not in (dict, None)
                                             or OmegaConf.is_struct(holder))
    return fixed and name in holder


def yaml_keys(config_name: str, **schemas: type) -> DictConfig:
    """The keys of hybridrl's YAML config `config_name`, fixed as Hydra composes them, with `schemas` for the
    sections its defaults list fills from a dataclass: what `declares` reads for a YAML-based entry point."""
    keys = OmegaConf.load(Path(__file__).parent / "config" / f"{config_name}.yaml")
    keys.pop("defaults", None)
    for section, schema in schemas.items():
        keys[section] = OmegaConf.structured(schema)
    OmegaConf.set_struct(keys, True)
    for section in schemas:  # typed fields are read by type; the dicts among them stay open
        OmegaConf.set_struct(keys[section], False)
    return keys


MEGATRON = "Megatron-LM is not available in hybridrl: it trains with FSDP2 only (run the recipe's FSDP script)"
VISION = "vision-language models (images and videos in prompts) are not supported yet"
# verl keys of features hybridrl lacks: a command line that sets one (or a key under one) stops before Hydra,
# naming the key and the feature, instead of failing as an unknown key
MISSING_FEATURES = {
    **{f"{role}.megatron": MEGATRON for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic",
                                                "reward_model")},
    **{f"data.{key}": VISION for key in ("image_key", "video_key", "image_patch_size", "return_multi_modal_inputs")},
    "actor_rollout_ref.actor.freeze_vision_tower": VISION,
    "actor_rollout_ref.rollout.limit_images": VISION,
}


def missing_feature(key: str) -> str | None:
    """Why `key` cannot run here, when it belongs to a feature hybridrl lacks."""
    parts = key.split(".")
    return next((MISSING_FEATURES[".".join(parts[:i])] for i in range(len(parts), 0, -1)
                 if ".".join(parts[:i]) in MISSING_FEATURES), None)


def verl_overrides(args: list[str], schema: Any) -> list[str]:
    """`args` with blank ones dropped and `+key=value` turned into `key=value` where `schema` (a config dataclass
    or a node, as `declares` reads it) declares key;
    raises ConfigError on a key of a feature hybridrl lacks (MISSING_FEATURES)."""
    kept, node = [], None
    for arg in args:
        key = arg.lstrip("+~").split("=", 1)[0]
        why = missing_feature(key) if "=" in arg or arg.startswith("~") else None
        if why is not None:
            raise ConfigError(f"{arg} is not supported by hybridrl: {why}. Remove {key}")
        if not arg.strip():
            logger.warning("ignoring a blank command-line argument (in a shell script, a `\\` followed by a space "
                           "or a comment passes one, and ends the command there)")
            continue
        if arg.startswith("+") and not arg.startswith("++") and "=" in arg:
            if node is None:
                node = schema if OmegaConf.is_config(schema) else OmegaConf.structured(schema)
            if declares(node, key):
                arg = arg[1:]
        kept.append(arg)
    return kept


class HybridrlConfigSearchPath(SearchPathPlugin):
    """hybridrl's configs right after the primary config directory: a user's YAML that extends `ppo_trainer`
    finds hybridrl's before any folder its `hydra.searchpath` adds."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if not any(element.path == CONFIG_DIR for element in search_path.get_path()):
            search_path.append("hybridrl", CONFIG_DIR, anchor=SearchPathQuery(provider="main"))


def register_config_search_path() -> None:
    """Add `HybridrlConfigSearchPath` to this process's Hydra (not to other Hydra apps in the environment)."""
    Plugins.instance().register(HybridrlConfigSearchPath)

PATH_SUFFIXES = ("path", "_dir", "_files")
PATH_KEYS = frozenset({"tokenizer", "input_tokenizer", "partial_pretrain"})


def absolute_local_path(value: Any, created: bool) -> Any:
    """`value` made absolute against the working directory if it is a relative local path: always when `created`
    (a directory the run makes), else only where it exists, so that a Hugging Face Hub id (`Qwen/Qwen2.5-0.5B`)
    stays one, as `from_pretrained` reads a local directory of that name first too. URIs (`hdfs://...`) and
    anything else are returned unchanged."""
    if isinstance(value, (list, tuple)):
        return type(value)(absolute_local_path(item, created) for item in value)
    if not isinstance(value, str) or not value or "://" in value:
        return value
    expanded = os.path.expanduser(value)  # the driver's home: a rank's may differ
    if os.path.isabs(expanded):
        return expanded
    return os.path.abspath(expanded) if created or os.path.exists(expanded) else value


def make_paths_absolute(node: Any) -> None:
    """Rewrite, in place, every path-named key of a config tree (dataclasses, OmegaConf nodes or dicts): keys
    ending in `PATH_SUFFIXES` or named in `PATH_KEYS`, `*_dir` ones as directories the run creates. The driver
    does it: ranks on other hosts start in their Ray node's working directory (verl's default
    `trainer.default_local_dir` is relative)."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        items = [(field.name, getattr(node, field.name)) for field in dataclasses.fields(node)]
        assign = lambda key, value: setattr(node, key, value)  # noqa: E731 - one setter per kind of node
    elif isinstance(node, (DictConfig, MutableMapping)):
        items = list(node.items())
        assign = node.__setitem__
    else:
        return
    for key, value in items:
        if isinstance(key, str) and (key.endswith(PATH_SUFFIXES) or key in PATH_KEYS):
            given = list(value) if isinstance(value, ListConfig) else value
            new = absolute_local_path(given, created=key.endswith("_dir"))
            if new != given:
                assign(key, new)
        else:
            make_paths_absolute(value)
