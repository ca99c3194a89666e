"""The run's config saved with each checkpoint, and what a resumed run changed relative to it.

A resumed run takes its settings from its own command line; the checkpoint contributes the weights,
the optimizer's moments, the schedule's position, the RNG states and the data position. So that no
setting is replaced silently in either direction, the trainers save the config next to the
checkpoint (`global_step_N/run_config.json`) and, on resume, log every key whose value differs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

RUN_CONFIG_FILE = "run_config.json"
# Keys that say where to resume from: they differ between a run and its resumption by design.
RESUME_KEYS = frozenset({"trainer.resume_mode", "trainer.resume_from_path"})


def write_run_config(step_dir: str | Path, config: Mapping[str, Any]) -> None:
    # default=str: the config is plain data, but a value typed Any may hold an object without a JSON form
    (Path(step_dir) / RUN_CONFIG_FILE).write_text(json.dumps(config, indent=2, default=str))


def read_run_config(step_dir: str | Path) -> dict[str, Any] | None:
    """The config saved with the checkpoint, or None (a checkpoint from before configs were saved)."""
    path = Path(step_dir) / RUN_CONFIG_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def changed_keys(saved: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (saved value, current value) for every key whose value differs (or exists in one only)."""
    # through JSON, so that tuples and lists (or anything saved with default=str) compare as saved
    old = flatten(json.loads(json.dumps(saved, default=str)))
    new = flatten(json.loads(json.dumps(current, default=str)))
    missing = "<absent>"
    return {key: (old.get(key, missing), new.get(key, missing)) for key in sorted(old.keys() | new.keys())
            if key not in RESUME_KEYS and old.get(key, missing) != new.get(key, missing)}


def report_config_changes(step_dir: str | Path, current: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Log, as one warning, each key that differs from the config saved in `step_dir`; returns them."""
    saved = read_run_config(step_dir)
    if saved is None:
        logger.warning("%s has no %s (saved by an older version): cannot tell which settings changed since",
                       step_dir, RUN_CONFIG_FILE)
        return {}
    changes = changed_keys(saved, current)
    if changes:
        listing = "\n".join(f"  {key}: {old!r} -> {new!r}" for key, (old, new) in changes.items())
        logger.warning(
            "resuming from %s with %d setting(s) changed since it was saved; this run's values apply "
            "(optimizer settings included; the weights, optimizer moments, schedule position and data "
            "position come from the checkpoint):\n%s", step_dir, len(changes), listing)
    return changes
