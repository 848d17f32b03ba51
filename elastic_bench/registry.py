"""A small name → object registry with aliases, lazy entries and "did you mean" errors (after lm-eval's Registry)."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(ValueError):
    """A user asked for a name that is not registered. The message names the closest valid ones."""


def did_you_mean(kind: str, name: str, valid: list[str]) -> UnknownNameError:
    """An `UnknownNameError` for ``name`` that names the closest of ``valid`` (and all of them when few)."""
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    listing = f"(valid: {', '.join(valid)})" if len(valid) <= 12 else f"({len(valid)} valid {kind} names)"
    return UnknownNameError(f"unknown {kind} {name!r}; {hint}{listing}")


class Registry(Generic[T]):
    """Maps names to objects. Entries are registered with the `register` decorator, or lazily as ``"module:attr"``
    strings that are imported on first `get` (for entries with heavy optional dependencies)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T | str] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        """Decorator: register the decorated object under ``name`` (and ``aliases``)."""

        def decorator(obj: T) -> T:
            self.add(name, obj, *aliases)
            return obj

        return decorator

    def add(self, name: str, obj: T | str, *aliases: str) -> None:
        """Register ``obj`` (or a lazy ``"module:attr"`` string) under ``name``."""
        if name in self._entries and self._entries[name] is not obj:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = obj
        for alias in aliases:
            self._aliases[alias] = name

    def get(self, name: str) -> T:
        """The object registered as ``name``; raises `UnknownNameError` naming the closest valid names."""
        name = self._aliases.get(name, name)
        if name not in self._entries:
            raise did_you_mean(self.kind, name, self.names())
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attr = entry.partition(":")
            entry = getattr(importlib.import_module(module), attr)
            self._entries[name] = entry
        return entry

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return self._aliases.get(name, name) in self._entries
