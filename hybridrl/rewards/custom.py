"""Load a user's reward function from a .py file (verl's `custom_reward_function` config).

It keeps verl's signature, `compute_score(data_source, solution_str, ground_truth, extra_info=None,
**kwargs)`, returning a float or a dict with a `score` key (other keys become per-sample metrics), with
`reward_kwargs` bound. It pickles as "load this file again", so the reward pool's worker processes
(hybridrl/rewards/pool.py) import the file themselves.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridrl.utils.typed_config import FreezableConfig, to_dataclass


@dataclass
class CustomRewardFunctionConfig(FreezableConfig):
    """`custom_reward_function.*`: the one home of these keys' defaults."""

    # A .py file defining compute_score(data_source, solution_str, ground_truth, extra_info=None).
    path: str | None = None
    name: str = "compute_score"
    # Keyword arguments bound to every call of the function.
    reward_kwargs: dict[str, Any] = field(default_factory=dict)


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
    path: str | Path, name: str = CustomRewardFunctionConfig.name, reward_kwargs: Mapping[str, Any] | None = None
) -> FileRewardFunction:
    """Import `path` as a fresh module and return its function `name` with `reward_kwargs` bound."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"custom_reward_function.path={str(path)!r} is not a file; give the path of a .py file")
    # one module name per file, so two custom files never replace each other
    module_name = f"hybridrl_custom_reward_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"custom_reward_function.path={str(path)!r} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(n for n, obj in vars(module).items() if inspect.isfunction(obj) and not n.startswith("_"))
        raise AttributeError(f"custom_reward_function.name={name!r} is not a function in {file}; functions "
                             f"there: {found}")
    return FileRewardFunction(fn, str(file.resolve()), name, dict(reward_kwargs or {}))


def get_custom_reward_fn(config: Mapping[str, Any]) -> Callable[..., Any] | None:
    """The function named by `config["custom_reward_function"]`, or None when no path is set."""
    section = to_dataclass(CustomRewardFunctionConfig, config.get("custom_reward_function") or {})
    if not section.path:
        return None
    return load_custom_reward_function(section.path, section.name, section.reward_kwargs)
