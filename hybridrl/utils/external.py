"""Classes a config names, as verl names them: by file or module (`class_path` a .py file or
`pkg://package.module`, `class_name` the class in it: data.custom_cls, data.sampler), or by dotted name
in a YAML list (multi_turn.tool_config_path, multi_turn.interaction_config_path)."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


def load_class(class_path: str, class_name: str, key: str, base: type) -> type:
    """The subclass of `base` named `class_name` in `class_path`; errors name the config `key`."""
    where = f"{key}={class_path!r}"
    if class_path.startswith("pkg://"):
        module = importlib.import_module(class_path.removeprefix("pkg://"))
    else:
        file = Path(class_path).expanduser()
        if not file.is_file():
            raise FileNotFoundError(f"{where} is neither a .py file nor pkg://<importable module>")
        # one module name per file, so two files of the same name never replace each other
        spec = importlib.util.spec_from_file_location(f"hybridrl_external_{abs(hash(str(file.resolve())))}", file)
        if spec is None or spec.loader is None:
            raise ImportError(f"{where} cannot be imported as a Python module")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{class_name!r} in {where} must be a {base.__module__}.{base.__qualname__} subclass, "
                        f"got {cls!r}")
    return cls


def import_class(dotted: str, where: str, base: type, fix: str) -> type:
    """The class `module.Class` names, a subclass of `base`; errors name `where` and, for a wrong class, `fix`."""
    module_name, _, class_name = dotted.rpartition(".")
    if not module_name:
        raise ValueError(f"{where}.class_name must be module.Class, got {dotted!r}")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as err:
        raise ImportError(f"{where}.class_name={dotted!r} cannot be imported: {err}") from err
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{where}.class_name={dotted!r} is not a subclass of {base.__module__}.{base.__qualname__} "
                        f"({fix})")
    return cls


def yaml_list(path: str | Path, section: str, key: str) -> tuple[Path, list[Any]]:
    """The entries a YAML file lists under `section:`, with the file's path; errors name the config `key`."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"{key}={path} is not a file")
    data = OmegaConf.to_container(OmegaConf.load(file), resolve=True)
    entries = data.get(section) if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{file} ({key}) must hold a list under `{section}:`, got {data!r}")
    return file, entries
