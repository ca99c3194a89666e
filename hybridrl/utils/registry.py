"""Things looked up by name. `Registry`, the one registry type (estimators, losses, reward managers, rollout
engines, ...): a duplicate name raises, and an unknown name lists the registered ones. And classes a config
names as verl names them: by file or module (`class_path` a .py file or `pkg://package.module`, `class_name`
the class in it: data.custom_cls, data.sampler), or by dotted name in a YAML list
(multi_turn.tool_config_path, multi_turn.interaction_config_path). And a user's reward function from a .py file
(verl's `custom_reward_function`): it pickles as "load this file again", so the reward pool's worker processes
import the file themselves, through this module, which stays light (no torch) for their start-up."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from omegaconf import OmegaConf

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A name that is not registered: a KeyError for hybridrl, a ValueError for code written against verl."""

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """A name -> object table with a decorator for registration.

    >>> losses = Registry("policy loss")
    >>> @losses.register("vanilla")
    ... def vanilla(x): return x
    >>> losses.get("vanilla") is vanilla
    True
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, *, override: bool = False) -> Callable[[T], T]:
        """Decorator storing the object under `name`; a duplicate raises unless `override=True`."""

        def decorator(obj: T) -> T:
            self.add(name, obj, override=override)
            return obj

        return decorator

    def add(self, name: str, obj: T, *, override: bool = False) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} names must be non-empty strings, got {name!r}")
        if name in self._entries and not override:
            raise ValueError(
                f"{self.kind} {name!r} is already registered ({self._entries[name]!r}); "
                f"pick another name or pass override=True"
            )
        self._entries[name] = obj

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; registered: {known}") from None

    # verl's registries are plain dicts that its users index, assign and clear (assignment overrides)
    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __setitem__(self, name: str, obj: T) -> None:
        self.add(name, obj, override=True)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def names(self) -> list[str]:
        return sorted(self._entries)


def import_file(path: str | Path, key: str, not_a_file: str = "is not a file; give the path of a .py file") -> Any:
    """The .py file `path` imported as a fresh module; errors name the config `key`."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"{key}={str(path)!r} {not_a_file}")
    # one module name per file, so two files of the same name never replace each other
    spec = importlib.util.spec_from_file_location(f"hybridrl_file_{abs(hash(str(file.resolve())))}", file)
    if spec is None or spec.loader is None:
        raise ImportError(f"{key}={str(path)!r} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_class(class_path: str, class_name: str, key: str, base: type) -> type:
    """The subclass of `base` named `class_name` in `class_path`; errors name the config `key`."""
    where = f"{key}={class_path!r}"
    if class_path.startswith("pkg://"):
        module = importlib.import_module(class_path.removeprefix("pkg://"))
    else:
        module = import_file(class_path, key, "is neither a .py file nor pkg://<importable module>")
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


DEFAULT_REWARD_FUNCTION = "compute_score"  # custom_reward_function.name's default, verl's


class FileRewardFunction:
    """A function loaded from a file with `reward_kwargs` bound; it pickles as (file, name, kwargs)."""

    def __init__(self, fn: Callable[..., Any], path: str, name: str, reward_kwargs: dict[str, Any]) -> None:
        self.fn = functools.partial(fn, **reward_kwargs) if reward_kwargs else fn
        self.path, self.name, self.reward_kwargs = path, name, reward_kwargs
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __reduce__(self) -> tuple:
        return load_custom_reward_function, (self.path, self.name, self.reward_kwargs)

    def __repr__(self) -> str:
        return f"<reward function {self.name!r} from {self.path}>"


def load_custom_reward_function(
    path: str | Path, name: str = DEFAULT_REWARD_FUNCTION, reward_kwargs: Mapping[str, Any] | None = None
) -> FileRewardFunction:
    """Import `path` as a fresh module and return its function `name` with `reward_kwargs` bound."""
    module = import_file(path, "custom_reward_function.path")
    file = Path(path).expanduser()
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(n for n, obj in vars(module).items() if inspect.isfunction(obj) and not n.startswith("_"))
        raise AttributeError(f"custom_reward_function.name={name!r} is not a function in {file}; functions "
                             f"there: {found}")
    return FileRewardFunction(fn, str(file.resolve()), name, dict(reward_kwargs or {}))
