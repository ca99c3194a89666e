"""verl's command lines for the Hydra entry points, read as verl reads them.

- `+key=value` on a key hybridrl's schema declares sets it: verl's scripts need the `+` where verl's own
  schema lacks a key that hybridrl's has (`+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype`).
- A blank argument (a shell line ending in `\\ ` with a trailing space or comment) is dropped with a warning
  instead of failing in Hydra's lexer.
- A key of a feature hybridrl lacks (Megatron, vision-language data) stops the run naming the feature;
  verl's `ppo_megatron_trainer` config is hybridrl's with `strategy: megatron`, which does the same.
- A user's config directory (`--config-path DIR --config-name NAME`) whose YAML lists `ppo_trainer` in its
  defaults composes against hybridrl's `ppo_trainer`: hybridrl's config directory joins Hydra's search path
  right after the user's, ahead of any `hydra.searchpath` the YAML names (such as verl's own config folder).
"""

from __future__ import annotations

import logging
from typing import Any

from hydra.core.config_search_path import ConfigSearchPath, SearchPathQuery
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

from hybridrl.utils.typed_config import ConfigError

logger = logging.getLogger(__name__)

CONFIG_DIR = "pkg://hybridrl.trainer.config"


def declares(node: Any, key: str) -> bool:
    """Whether `key` (dotted) is a field of the structured config `node`, not an entry of one of its dicts."""
    parent, _, name = key.rpartition(".")
    holder = OmegaConf.select(node, parent, default=None) if parent else node
    return OmegaConf.is_config(holder) and OmegaConf.get_type(holder) not in (dict, None) and name in holder


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
    """`args` with blank ones dropped and `+key=value` turned into `key=value` where `schema` declares key;
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
            node = OmegaConf.structured(schema) if node is None else node
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
