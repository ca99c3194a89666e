"""A run's local paths made absolute on the driver, against its working directory.

Ranks on other hosts start in their Ray node's working directory, not the driver's: a relative checkpoint
directory or model path would name another place there (verl's default `trainer.default_local_dir` is relative).
Keys that name paths: those ending in `path`, `_dir` or `_files`, and `tokenizer`, `input_tokenizer`,
`partial_pretrain`. A directory the run creates (`*_dir`) becomes absolute whether or not it exists yet; any other
relative value only where it exists here, so that a Hugging Face Hub id (`Qwen/Qwen2.5-0.5B`) stays one, as
`from_pretrained` reads a local directory of that name first too. URIs (`hdfs://...`) stay as given.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import MutableMapping
from typing import Any

from omegaconf import DictConfig, ListConfig

PATH_SUFFIXES = ("path", "_dir", "_files")
PATH_KEYS = frozenset({"tokenizer", "input_tokenizer", "partial_pretrain"})


def is_path_key(key: str) -> bool:
    return key.endswith(PATH_SUFFIXES) or key in PATH_KEYS


def absolute_local_path(value: Any, created: bool) -> Any:
    """`value` made absolute against the working directory if it is a relative local path: always when `created`
    (a directory the run makes), else only where it exists. Anything else is returned unchanged."""
    if isinstance(value, (list, tuple)):
        return type(value)(absolute_local_path(item, created) for item in value)
    if not isinstance(value, str) or not value or "://" in value:
        return value
    expanded = os.path.expanduser(value)  # the driver's home: a rank's may differ
    if os.path.isabs(expanded):
        return expanded
    return os.path.abspath(expanded) if created or os.path.exists(expanded) else value


def make_paths_absolute(node: Any) -> None:
    """Rewrite, in place, every path-named key of a config tree (dataclasses, OmegaConf nodes or dicts)."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        items = [(field.name, getattr(node, field.name)) for field in dataclasses.fields(node)]
        assign = lambda key, value: setattr(node, key, value)  # noqa: E731 - one setter per kind of node
    elif isinstance(node, (DictConfig, MutableMapping)):
        items = list(node.items())
        assign = node.__setitem__
    else:
        return
    for key, value in items:
        if isinstance(key, str) and is_path_key(key):
            given = list(value) if isinstance(value, ListConfig) else value
            new = absolute_local_path(given, created=key.endswith("_dir"))
            if new != given:
                assign(key, new)
        else:
            make_paths_absolute(value)
