"""Readable names of method configurations: ``duo_attention (s=0.7)`` for the result folder
``duo_attention-pattern=%2F…%2FMeta-Llama-3.1-8B-Instruct-sparsity=0.7``.

Design decisions:
- A label is the method's name plus the options its folder name records (those that differ from their defaults), in
  the folder's order; a file path shows its last component only, never an absolute path.
- A few long option names have a short form (`SHORT`); the legend table of a report keeps every option in full.
- Two configurations that would share a label get their folder names instead (still without absolute paths).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

SHORT = {"sparsity": "s", "threshold": "τ", "xa_threshold": "xa_τ", "granularity": "gran"}
"""Short forms of option names in labels."""


def show_value(value: Any) -> str:
    """An option value as a report shows it: paths by their last component, floats without trailing noise."""
    if isinstance(value, float):
        return f"{value:g}"
    text = str(value)
    if "/" in text or "\\" in text:
        return re.split(r"[/\\]", text.rstrip("/\\"))[-1] or text
    return text


def changed_options(folder: str, method_name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options that the result folder's name records (``name-key=value-...``), in its order, with their values
    from ``options`` (the folder encodes ``/`` as ``%2F``; the options hold the values themselves)."""
    rest = unquote(folder[len(method_name):]) if folder.startswith(method_name) else unquote(folder)
    found = sorted((rest.find(f"-{key}="), key) for key in options if f"-{key}=" in rest)
    return {key: options[key] for _, key in found}


def short_label(folder: str, method_name: str, options: dict[str, Any]) -> str:
    """``name (k=v, ...)`` of one configuration, e.g. ``streaming (sink=16, local=256)``; the folder's name, paths
    shortened, when its options are unknown (results written without ``method_options``)."""
    changed = changed_options(folder, method_name, options)
    if not changed:
        return method_name if folder == method_name else folder_label(folder)
    return f"{method_name} (" + ", ".join(f"{SHORT.get(k, k)}={show_value(v)}" for k, v in changed.items()) + ")"


def folder_label(folder: str) -> str:
    """A result folder's name with every path shortened to its last component."""
    return re.sub(r"=([^=]*/)+", "=", unquote(folder).replace("\\", "/"))


def unique_labels(labels: list[str], fallbacks: list[str]) -> list[str]:
    """``labels``, where any that occurs twice is replaced by its fallback (and by ``fallback #i`` if that repeats)."""
    first = [f if labels.count(label) > 1 else label for label, f in zip(labels, fallbacks)]
    return [f"{label} #{first[:i].count(label) + 1}" if first.count(label) > 1 else label
            for i, label in enumerate(first)]


def run_names(paths: list[str]) -> list[str]:
    """Short distinct names of run folders: each folder's last component, or as many trailing components as tell
    them apart (``a/demo``, ``b/demo`` → ``a/demo``, ``b/demo``)."""
    parts = [Path(p).resolve().parts for p in paths]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [str(Path(p).resolve()) for p in paths]
