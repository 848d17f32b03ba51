"""A small name → object registry with aliases, plugin discovery and "did you mean" errors (after
lm-eval's Registry).

Design decisions:
- Plugins come in through an entry-point group, in one of two forms. A *declaration* ``name = "package.module:Object"``
  says that importing the module registers ``Object`` as ``name`` (one entry point per name and per alias); a
  *module* entry point ``anything = "package.module"`` only says to import the module. When every entry point of a
  group is a declaration, its names are known from the installed metadata alone (`declared`), so a command refuses
  an unknown name without importing the code behind the others (and torch with it).
- Discovery checks every declaration: the module registers the object under the declared name, and every name and
  alias registered while it imports is declared, so the declarations cannot drift from the code.

Part of the foundation: imports nothing of elastic-bench, so every pillar may use it.
"""

from __future__ import annotations

import difflib
import importlib.metadata
from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(ValueError):
    """A user asked for a name that is not registered. The message names the closest valid ones."""


def did_you_mean(kind: str, name: str, valid: list[str], every: bool = False) -> UnknownNameError:
    """An `UnknownNameError` for ``name`` that names the closest of ``valid`` (and all of them when few, or with
    ``every``)."""
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    listing = f"(valid: {', '.join(valid)})" if every or len(valid) <= 12 else f"({len(valid)} valid {kind} names)"
    return UnknownNameError(f"unknown {kind} {name!r}; {hint}{listing}")


def _entry_points(kind: str, group: str) -> importlib.metadata.EntryPoints:
    """The entry points of ``group``; ImportError when there are none (the package is not installed)."""
    points = importlib.metadata.entry_points(group=group)
    if not points:
        raise ImportError(f"no {kind} plugins under entry-point group {group!r}: elastic-bench is not installed "
                          "(pip install -e . in the checkout; PYTHONPATH is not enough)")
    return points


def declared(kind: str, group: str) -> list[str] | None:
    """The names (aliases included) declared under the entry-point group ``group``, sorted, read from the installed
    metadata without importing anything; None when an entry point of the group names a module only, whose names are
    known once it is imported.

    Raises:
        ImportError: the group has no entry points (the package is not installed).
    """
    points = _entry_points(kind, group)
    if any(point.attr is None for point in points):
        return None
    return sorted({point.name for point in points})


def check_declared(kind: str, group: str, names: Iterable[str]) -> None:
    """Refuse the first of ``names`` that is not declared under ``group`` with an `UnknownNameError` naming the
    closest declared names, without importing anything. When the group's names are known only by importing
    (`declared` is None), this passes and the registry's lookup checks them."""
    valid = declared(kind, group)
    for name in names if valid is not None else ():
        if name not in valid:
            raise did_you_mean(kind, name, valid)


class Registry(Generic[T]):
    """Maps names (and aliases) to objects.

    With ``entry_points``, the modules that installed distributions list under that entry-point group (in
    ``pyproject.toml``: ``[project.entry-points."<group>"] name = "package.module:Object"``, a declaration, or
    ``name = "package.module"``) are imported on the first lookup; they register their entries as they import, and
    each declaration is checked against what its module registered. elastic-bench's own methods and the testbed
    tasks come in this way, so a registry never imports the code that fills it, and a third-party package adds
    entries alike.
    """

    def __init__(self, kind: str, entry_points: str | None = None):
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}
        self._group = entry_points
        self._discovered = entry_points is None
        self._failure: ImportError | None = None  # why discovery failed: every later lookup raises it again

    def _discover(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._discovered:
            return
        self._discovered = True  # before loading: the modules register through this registry
        try:
            points = _entry_points(self.kind, self._group)
            names = {point.name for point in points}
            for point in points:
                before = self._known()
                loaded = point.load()
                if point.attr is not None:
                    self._check_declaration(point, loaded, self._known() - before, names)
        except ImportError as err:
            self._failure = err
            raise

    def _known(self) -> set[str]:
        return set(self._entries) | set(self._aliases)

    def _check_declaration(self, point: importlib.metadata.EntryPoint, loaded: object, added: set[str],
                           declared_names: set[str]) -> None:
        """Refuse a declaration ``point`` whose module does not register ``loaded`` as ``point.name``, or that
        registered names (``added``) not declared in the group (``declared_names``)."""
        where = f"entry point {point.name} = {point.value!r} of group {self._group!r}"
        if self._entries.get(self._aliases.get(point.name, point.name)) is not loaded:
            raise ImportError(f"{where}: its module does not register that object as {self.kind} {point.name!r}")
        if undeclared := sorted(added - declared_names):
            raise ImportError(f"{where}: importing it registered {self.kind} names not declared in the group: "
                              f"{', '.join(undeclared)} (declare each name and alias as an entry point)")

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

    def aliases(self) -> dict[str, str]:
        """Registered aliases, each to the name it stands for."""
        self._discover()
        return dict(self._aliases)

    def __contains__(self, name: str) -> bool:
        self._discover()
        return self._aliases.get(name, name) in self._entries
