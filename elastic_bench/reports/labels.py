"""Readable names of method configurations: ``duo_attention (pattern=Meta-Llama-3.1-8B-Instruct, s=0.7)`` for the
result folder ``duo_attention-pattern=%2F…%2FMeta-Llama-3.1-8B-Instruct-sparsity=0.7``, ``elastic
(router=sensitive_0.6)`` for ``elastic-router=sensitive_0.6``, ``elastic (router=testbed/elastic_router)`` for the
folder ``elastic`` of a run whose router was the model's own.

Design decisions:
- A label is the method's name plus the options its folder name records (those that differ from their defaults, the
  runner's `Method.label`), in the folder's order, with their values from the cell's options where it records them
  and from the folder's name otherwise (a learned file, known to the cell by its digest, keeps the name it was given);
  a file path shows its last component only, never an absolute path. A learned file the folder's name does not record
  (the method found it, ``auto``) is shown by the name its cells record (``learned_files``): which file a row used is
  always in its label.
- A few long option names have a short form (`SHORT`); the legend table of a report keeps every option in full.
- Two configurations that would share a label get their folder names instead (still without absolute paths).
- The options a configuration left unset (None: a learned file's own, e.g. elastic's streaming geometry) are shown
  with the values it ran with where its cells record them (``method_resolved``, written by the runner once the method
  has loaded its files): a legend then tells apart two routers of different geometries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from .collect import CellResult

SHORT = {"sparsity": "s", "threshold": "τ", "xa_threshold": "xa_τ", "granularity": "gran", "window_size": "window",
         "dense_len": "dense"}
"""Short forms of option names in labels."""


def show_value(value: Any) -> str:
    """An option value as a report shows it: paths by their last component, floats without trailing noise."""
    if isinstance(value, float):
        return f"{value:g}"
    text = str(value)
    if "/" in text or "\\" in text:
        return re.split(r"[/\\]", text.rstrip("/\\"))[-1] or text
    return text


def folder_options(folder: str, method_name: str) -> dict[str, str]:
    """The ``key=value`` pairs that a result folder's name records after the method's name, in its order, decoded
    (the runner writes ``/`` in a value as ``%2F``); {} for a folder not named ``name-key=value-...``."""
    if not folder.startswith(f"{method_name}-"):
        return {}
    found = {}
    for pair in re.split(r"-(?=[A-Za-z_][A-Za-z0-9_]*=)", folder[len(method_name) + 1:]):
        key, sep, value = pair.partition("=")
        if not sep:
            return {}
        found[key] = unquote(value)
    return found


def changed_options(folder: str, method_name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options that the result folder's name records, in its order, with their values from ``options`` where
    they are there (the folder's text otherwise)."""
    return {key: options.get(key, value) for key, value in folder_options(folder, method_name).items()}


def short_label(folder: str, method_name: str, options: dict[str, Any], learned: dict[str, str] | None = None) -> str:
    """``name (k=v, ...)`` of one configuration, e.g. ``streaming (sink=16, local=256)``; the folder's name, paths
    shortened, when it is not named after the method. The learned files the folder's name does not record (a method
    left at ``auto``) follow by the name the cells record (``learned``, `CellResult.learned_files`), e.g.
    ``duo_attention (pattern=testbed/duo_gates)``."""
    named = folder_options(folder, method_name)
    if folder != method_name and not named:
        return folder_label(folder)
    parts = [f"{SHORT.get(k, k)}={show_value(v)}" for k, v in changed_options(folder, method_name, options).items()]
    parts += [f"{k}={v}" for k, v in (learned or {}).items() if k not in named]
    return f"{method_name} (" + ", ".join(parts) + ")" if parts else method_name


def resolved_options(cells: Iterable[CellResult]) -> dict[str, Any]:
    """The options a configuration left unset, with the values its ``cells`` ran with (the ``method_resolved`` of the
    first cell whose ``metrics.json`` records them, e.g. ``{"sink": 128, "local": 2048}``); {} where none does (a run
    written before the runner recorded them, or a method whose unset options defer to no file)."""
    for cell in cells:
        metrics = (cell.cell.metrics() if cell.cell is not None else None) or {}
        if isinstance(resolved := metrics.get("method_resolved"), dict) and resolved:
            return resolved
    return {}


def ran_with(cells: Iterable[CellResult]) -> str:
    """`resolved_options` as a legend shows them, ``mode=fa-ssa, sink=16, local=256``; ``–`` for none."""
    return ", ".join(f"{k}={show_value(v)}" for k, v in resolved_options(cells).items()) or "–"


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
