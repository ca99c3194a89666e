"""The one registry type for everything hybridrl looks up by name (estimators, losses, reward managers,
rollout engines, ...): a duplicate name raises, and an unknown name lists the registered ones."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

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
