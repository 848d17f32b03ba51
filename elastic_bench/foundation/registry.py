"""A small name → object registry with aliases, plugin discovery and "did you mean" errors (after
lm-eval's Registry).

Part of the foundation: imports nothing of elastic-bench, so every pillar may use it.
"""

from __future__ import annotations

import difflib
import importlib.metadata
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
    """Maps names (and aliases) to objects.

    With ``entry_points``, the modules that installed distributions declare under that entry-point group (in
    ``pyproject.toml``: ``[project.entry-points."<group>"] name = "package.module"``) are imported on the first
    lookup; they register their entries as they import. elastic-bench's own methods and the testbed tasks come in
    this way, so a registry never imports the code that fills it, and a third-party package adds entries alike.
    """

    def __init__(self, kind: str, entry_points: str | None = None):
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}
        self._group = entry_points
        self._discovered = entry_points is None

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True  # before loading: the modules register through this registry
        found = {ep.name: ep for ep in importlib.metadata.entry_points(group=self._group)}
        if not found:
            raise ImportError(f"no {self.kind} plugins under entry-point group {self._group!r}: elastic-bench is not "
                              "installed (pip install -e . in the checkout; PYTHONPATH is not enough)")
        for ep in found.values():
            ep.load()

    def add(self, name: str, obj: T, *aliases: str) -> None:
        """Register ``obj`` under ``name`` (and ``aliases``)."""
        if name in self._entries and self._entries[name] is not obj:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = obj
        for alias in aliases:
            self._aliases[alias] = name

    def get(self, name: str) -> T:
        """The object registered as ``name``; raises `UnknownNameError` naming the closest valid names."""
        self._discover()
        name = self._aliases.get(name, name)
        if name not in self._entries:
            raise did_you_mean(self.kind, name, self.names())
        return self._entries[name]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        self._discover()
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        self._discover()
        return self._aliases.get(name, name) in self._entries
