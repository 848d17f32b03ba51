"""Options declared once: a config dataclass's fields give each command-line option its name, type and default, and
the class docstring gives its help; values from YAML files and ``-O`` method options are checked against the same
types.

- Help: the ``Attributes:`` (or ``Args:``) section of the class docstring, one ``name: text`` entry per field
  (``a, b: text`` documents several), continuation lines indented deeper.
- Types: ``int``, ``float``, ``str``, ``bool``, ``Literal[...]`` (choices), ``X | None``, ``X | Y`` (the first that
  takes the value, e.g. a number or a name), ``list[int]`` / ``list[str]`` / ``tuple[...]`` (comma-separated; ints
  accept ``4K`` = 4096 and ``1M`` = 1024K), ``dict[str, float]`` (``a=0.5,b=1``, repeatable) and nested config
  dataclasses (their fields become options of their own).
- Flags: ``--field-name``; a bool that defaults to False is a switch, one that defaults to True has a ``--no-`` form.
- ``-O METHOD.OPTION=VALUE`` values are text (`CommandLineText`), read by the option's declared type as its flag
  would be (``4K``, ``none``, ``true``/``false``), never as YAML: a path holding `` #`` stays that path.
- Numbers are finite: ``inf`` and ``nan`` are refused wherever a ``float`` is expected (on the command line, in YAML
  files and ``-O`` options); no option of elastic-bench has a meaning for them (a NaN learning rate trains a NaN
  router).
- Checks the commands' configs share (`check_at_least`, `check_lengths`, `check_folder_output`, `check_file_output`):
  each refuses a bad value with one ValueError naming the flag, before any work starts.

Part of the foundation: imports nothing of elastic-bench, so every pillar may use it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import operator
import re
import types
import typing
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, Literal, Union

TOKEN_UNITS = {"K": 1024, "M": 1024**2}


def tokens(value: str) -> int:
    """A token count: ``4096``, ``4K`` or ``4k`` (= 4096), ``1M`` or ``1m`` (= 1,048,576)."""
    text = str(value).strip().upper()
    unit = TOKEN_UNITS.get(text[-1:], 1)
    return int(text[:-1]) * unit if unit > 1 else int(text)


@cache
def field_help(cls: type) -> dict[str, str]:
    """``{field name: help}`` from the ``Attributes:`` / ``Args:`` sections of the docstrings of ``cls`` and its bases
    (a subclass's entry wins)."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if "__doc__" in vars(klass) and klass.__doc__:
            found |= _section_entries(klass.__doc__)
    return found


def _section_entries(doc: str) -> dict[str, str]:
    lines = doc.expandtabs().splitlines()
    found: dict[str, str] = {}
    section_indent = None
    current: list[str] = []
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped in ("Attributes:", "Args:"):
            section_indent, current = indent, []
            continue
        if section_indent is None:
            continue
        if stripped and indent <= section_indent:
            section_indent = None
            continue
        entry = re.match(r"([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*:\s*(.*)", stripped)
        if entry and indent == section_indent + 4:
            current = [n.strip() for n in entry.group(1).split(",")]
            for name in current:
                found[name] = entry.group(2)
        elif stripped and current:
            for name in current:
                found[name] += " " + stripped
    return found


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _optional(tp: Any) -> tuple[Any, bool]:
    """(the type without ``None``, whether ``None`` is allowed)."""
    if _is_union(tp):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        return functools.reduce(operator.or_, args), optional
    return tp, False


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _describe(tp: Any) -> str:
    tp, optional = _optional(tp)
    origin = typing.get_origin(tp)
    if _is_union(tp):  # e.g. a number or one of some names
        text = " or ".join(_describe(a) for a in typing.get_args(tp))
    elif origin is Literal:
        text = "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    elif origin in (list, tuple):
        item = _describe(typing.get_args(tp)[0])
        text = "a list of " + {"an integer": "integers", "a number": "numbers", "a string": "strings"}.get(item, item)
    elif origin is dict:
        text = "a mapping NAME=" + _describe(typing.get_args(tp)[1])
    else:
        text = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))
    return text + (" or null" if optional else "")


class CommandLineText(str):
    """A value typed on the command line (``-O METHOD.OPTION=VALUE``): `check_value` reads it by the field's declared
    type, as the field's own flag reads its text."""


def check_value(cls: type, name: str, value: Any, where: str) -> Any:
    """``value`` for field ``name`` of dataclass ``cls``, checked against the field's type (ints are accepted for
    floats, lists for tuples; a `CommandLineText` is read by the type first); raises ValueError naming ``where`` and
    the expected type."""
    tp = _hints(cls)[name]
    try:
        if isinstance(value, CommandLineText):
            return _check(tp, _parser(tp, name)(str(value)))
        return _check(tp, value)
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        given = str(value) if isinstance(value, CommandLineText) else value
        raise ValueError(f"{where} must be {_describe(tp)}, got {given!r}") from None


def _check(tp: Any, value: Any) -> Any:
    tp, optional = _optional(tp)
    if value is None:
        if optional or tp is Any:
            return None
        raise TypeError
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if _is_union(tp):  # the first type that takes the value
        for arm in typing.get_args(tp):
            try:
                return _check(arm, value)
            except (TypeError, ValueError):
                continue
        raise ValueError
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ValueError
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise TypeError
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError
        return _finite(value)
    if tp is str:
        if not isinstance(value, str):
            raise TypeError
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise TypeError
        args = typing.get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ValueError
            return tuple(_check(a, v) for a, v in zip(args, value))
        items = [_check(args[0], v) for v in value] if args else list(value)
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError
        key_type, value_type = typing.get_args(tp) or (Any, Any)
        return {_check(key_type, k): _check(value_type, v) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise TypeError
        unknown = set(value) - {f.name for f in dataclasses.fields(tp)}
        if unknown:
            raise ValueError
        return tp(**{k: _check(_hints(tp)[k], v) for k, v in value.items()})
    if isinstance(tp, type) and not isinstance(value, tp):
        raise TypeError
    return value


def check_fields(cls: type, values: dict[str, Any], where: str) -> dict[str, Any]:
    """Every value of ``values`` checked with `check_value`; unknown keys raise ValueError naming the valid ones."""
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; valid keys: {sorted(valid)}")
    return {k: check_value(cls, k, v, f"{where}: {k}") for k, v in values.items()}


_BOOLEANS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def _boolean(text: str) -> bool:
    """``true``/``yes``/``on`` or ``false``/``no``/``off`` (any case) as a bool."""
    try:
        return _BOOLEANS[text.strip().lower()]
    except KeyError:
        raise ValueError(f"not true or false: {text!r}") from None


def _finite(value: str | int | float) -> float:
    """``value`` as a float; ValueError for ``inf``, ``nan`` and anything not a number."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a finite number")
    return number


# ---- command line ------------------------------------------------------------------------------------------------


def _parser(tp: Any, name: str):
    """The argparse ``type=`` function of one field type (None for a bool switch)."""
    tp, optional = _optional(tp)
    origin = typing.get_origin(tp)
    described = _describe(tp)

    def wrap(convert):
        def parse(text: str):
            if optional and text.lower() in ("none", "null"):
                return None
            try:
                return convert(text)
            except (TypeError, ValueError):
                raise argparse.ArgumentTypeError(f"--{name} takes {described}; got {text!r}") from None

        parse.__name__ = described
        return parse

    if _is_union(tp):
        arms = [_parser(a, name) for a in typing.get_args(tp)]

        def first(text: str):
            for arm in arms:
                try:
                    return _check(tp, arm(text))
                except (TypeError, ValueError, argparse.ArgumentTypeError):
                    continue
            raise ValueError

        return wrap(first)
    if tp is int:
        return wrap(tokens)
    if tp is bool:  # a switch on the command line; this reads the text of a `CommandLineText`
        return wrap(_boolean)
    if tp is float:
        return wrap(_finite)
    if tp is str or origin is Literal:
        return wrap(str)
    if origin in (list, tuple):
        args = typing.get_args(tp)
        item = _parser(args[0], name) if args else str
        return wrap(lambda text: _check(tp, [item(v.strip()) for v in text.split(",") if v.strip()]))
    if origin is dict:
        value = _parser(typing.get_args(tp)[1], name)

        def mapping(text: str) -> dict:
            pairs = [p.rpartition("=") for p in text.split(",") if p.strip()]
            if not pairs or any(not sep or not key.strip() for key, sep, _ in pairs):
                raise ValueError
            return {key.strip(): value(raw.strip()) for key, _, raw in pairs}

        return wrap(mapping)
    raise TypeError(f"option --{name}: no command-line form for {tp!r}")


class _Merge(argparse.Action):
    """A repeatable ``NAME=VALUE`` option whose values are merged into one mapping."""

    def __call__(self, parser, namespace, values, option_string=None):
        current = getattr(namespace, self.dest)
        merged = dict(current) if current is not self.default else {}
        merged.update(values)
        setattr(namespace, self.dest, merged)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def add_options(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = (),
                flags: Mapping[str, str] | None = None, defaults: Mapping[str, Any] | None = None,
                helps: Mapping[str, str] | None = None) -> None:
    """Add one option per field of dataclass ``cls`` (nested config dataclasses: one per field of theirs).

    Args:
        parser: where to add them.
        cls: the config dataclass.
        skip: fields that get no option (set by the command itself).
        flags: a flag other than ``--field-name`` for some fields (e.g. ``{"targets": "--target"}``).
        defaults: defaults other than the field's, for a command that runs a fixed configuration (e.g. the demo).
        helps: help other than the class docstring's for some fields (what a shared field means to this command).
    """
    help_of = field_help(cls) | dict(helps or {})
    hints = _hints(cls)
    flags, defaults = flags or {}, defaults or {}
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        tp, _ = _optional(hints[f.name])
        if dataclasses.is_dataclass(tp):
            add_options(parser, tp, skip, flags, defaults, helps)
            continue
        flag = flags.get(f.name, "--" + f.name.replace("_", "-"))
        default = defaults.get(f.name, _default(f))
        text = help_of.get(f.name)
        if not text:
            raise TypeError(f"{cls.__name__}.{f.name} has no help: document it in the class docstring")
        shown = "" if default is None or isinstance(default, bool) else f" (default: {_show(default)})"
        kwargs: dict[str, Any] = {"dest": f.name, "default": default, "help": text.replace("%", "%%") + shown}
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in defaults:
            kwargs["required"] = True
        if tp is bool:
            kwargs["action"] = argparse.BooleanOptionalAction if default else "store_true"
        else:
            kwargs["type"] = _parser(hints[f.name], flag[2:])
            kwargs["metavar"] = f.name.upper()
            if typing.get_origin(tp) is Literal:
                kwargs["choices"] = list(typing.get_args(tp))
                del kwargs["metavar"]
            if typing.get_origin(tp) is dict:
                kwargs["action"] = _Merge
        parser.add_argument(flag, **kwargs)


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def from_args(cls: type, args: argparse.Namespace, **fixed: Any) -> Any:
    """An instance of ``cls`` from the parsed options `add_options` added (nested dataclasses rebuilt), with
    ``fixed`` fields set by the command."""
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp, _ = _optional(hints[f.name])
        if f.name in fixed:
            values[f.name] = fixed[f.name]
        elif dataclasses.is_dataclass(tp):
            values[f.name] = from_args(tp, args, **fixed)
        elif hasattr(args, f.name):
            values[f.name] = getattr(args, f.name)
    return cls(**values)


def command_line(cls: type, config: Any, flags: dict[str, str] | None = None) -> list[str]:
    """The options that rebuild ``config`` (fields that differ from their defaults), as command-line words."""
    hints = _hints(cls)
    flags = flags or {}
    words: list[str] = []
    for f in dataclasses.fields(cls):
        value = getattr(config, f.name)
        tp, _ = _optional(hints[f.name])
        if dataclasses.is_dataclass(tp):
            words += command_line(tp, value, flags)
            continue
        if value == _default(f):
            continue
        flag = flags.get(f.name, "--" + f.name.replace("_", "-"))
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + flag[2:])
        else:
            words += [flag, "none" if value is None else _show(value)]
    return words


# ---- checks of option values shared by the commands' configs (one line each, before any work starts) --------------


def check_at_least(flag: str, value: int | float | None, minimum: int) -> None:
    """Refuse ``value`` (when given) below ``minimum``."""
    if value is not None and value < minimum:
        raise ValueError(f"{flag} must be >= {minimum}, got {value}")


def check_lengths(flag: str, lengths: list[int]) -> None:
    """Refuse an empty list of token lengths, one holding a length below 1, or one giving a length twice (``1K,1024``:
    a run would count its cells twice)."""
    if not lengths or any(length < 1 for length in lengths):
        raise ValueError(f"{flag} must be positive token counts, got {','.join(map(str, lengths)) or 'none'}")
    twice = sorted({n for n in lengths if lengths.count(n) > 1})
    if twice:
        raise ValueError(f"{flag} gives {', '.join(map(str, twice))} tokens more than once (1K = 1024 tokens, 1M = "
                         f"1024K); give each length once")


def _file_above(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` when it is a file (nothing can be created under it), else None."""
    for existing in path.parents:
        if existing.exists():
            return None if existing.is_dir() else existing
    return None


def _named(path: str | Path, flag: str) -> Path:
    """``path`` as a `Path`; an empty one (which would mean the current directory) is refused."""
    if not str(path).strip():
        raise ValueError(f"{flag} is empty; give a path")
    return Path(path)


def check_folder_output(path: str | Path, flag: str = "--output") -> None:
    """Refuse an empty output path, one that exists but is not a folder (a file, a device, a FIFO), or one that lies
    inside a file."""
    path = _named(path, flag)
    if path.exists() and not path.is_dir():
        kind = "a file" if path.is_file() else "a device, FIFO or socket"
        raise ValueError(f"{flag} {path} is {kind}; expected a folder")
    if blocked := _file_above(path):
        raise ValueError(f"{flag} {path} lies inside {blocked}, which is a file; expected a folder")


def check_file_output(path: str | Path, flag: str = "--output") -> None:
    """Refuse an empty output path, an existing folder, an existing special file (a device, a FIFO, a socket: writing
    would replace it), or a path inside a file."""
    path = _named(path, flag)
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a folder; expected a file name")
    if path.exists() and not path.is_file():
        raise ValueError(f"{flag} {path} is a device, FIFO or socket; expected a file name")
    if blocked := _file_above(path):
        raise ValueError(f"{flag} {path} lies inside {blocked}, which is a file")
