"""Commands declared once, beside their code: a `Command` record holds everything ``elastic-bench`` knows of one
command, and a `Group` the word that gathers several (``bench``, ``testbed``).

- Each folder with commands lists its records as ``COMMANDS`` in a light ``commands`` module (no torch at import);
  `elastic_bench.cli` assembles them into one parser.
- A command's options are the fields of its config dataclasses (`elastic_bench.foundation.options.add_options`), in
  the order of its ``configs``; a field may instead be a positional word, get another flag, default or help (what a
  shared field means to this command), or no option at all.
- A config class whose module imports torch is named ``"module:Class"`` and imported only when its command is parsed,
  so ``elastic-bench --help`` stays instant.
- The handler receives its record and the parsed arguments, builds its configs with `Command.configs_from` and
  returns the exit status.

Part of the foundation: imports nothing of elastic-bench beyond it.
"""

from __future__ import annotations

import argparse
import importlib
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .options import add_options, field_help, from_args


def resolve(target: Any) -> Any:
    """The object a ``"module:name"`` string names (its module imported now); any other ``target`` as it is."""
    if not isinstance(target, str):
        return target
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Group:
    """The first word of commands named ``"GROUP COMMAND"`` (``elastic-bench GROUP COMMAND ...``).

    Attributes:
        name: the word.
        help: one line, in the command list and as the group's description.
    """

    name: str
    help: str


@dataclass(frozen=True)
class Command:
    """One ``elastic-bench`` command.

    Attributes:
        name: its words after ``elastic-bench`` (``"run"``, or ``"bench prefill"`` within the `Group` ``bench``).
        help: one line, in the command list.
        description: the paragraph its ``--help`` opens with.
        handler: ``handler(command, args)`` runs it and returns the exit status (0 done, 1 some work failed).
        configs: the config dataclasses whose fields are its options, in order; ``"module:Class"`` for one whose
            module imports torch.
        positional: fields given as words instead of options (a list field takes one or more).
        flags: a flag other than ``--field-name``, per field.
        skipped: fields without an option (the handler sets them, or their default holds).
        defaults: a default other than the field's, per field.
        helps: a help other than the class docstring's, per field.
        arguments: adds the arguments that no config field declares (``run``'s ``--config`` and ``-O``).
        file_defaults: defaults read from a file the parsed arguments name (``run --config``); the command line is
            parsed again with them, so its flags override them.
        passthrough: every word after the command goes unparsed to the handler as ``args.passthrough_args``, ``-h``
            included (``lm-eval``).
    """

    name: str
    help: str
    description: str
    handler: Callable[[Command, argparse.Namespace], int]
    configs: tuple[type | str, ...] = ()
    positional: tuple[str, ...] = ()
    flags: Mapping[str, str] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    helps: Mapping[str, str] = field(default_factory=dict)
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    file_defaults: Callable[[argparse.Namespace], dict[str, Any]] | None = None
    passthrough: bool = False

    def config_classes(self) -> list[type]:
        """The config dataclasses, imported."""
        return [resolve(entry) for entry in self.configs]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the command's positional words and options to its ``parser``."""
        for cls in self.config_classes():
            hints = typing.get_type_hints(cls)
            for name in self.positional:
                if name in hints:
                    many = typing.get_origin(hints[name]) is list
                    parser.add_argument(name, nargs="+" if many else None, help=field_help(cls)[name])
            add_options(parser, cls, skip=(*self.skipped, *self.positional), flags=self.flags, defaults=self.defaults,
                        helps=self.helps)
        if self.arguments is not None:
            self.arguments(parser)

    def configs_from(self, args: argparse.Namespace, **fixed: Any) -> list[Any]:
        """One instance per config class, from the parsed ``args``, with ``fixed`` fields set by the handler
        (`elastic_bench.foundation.options.from_args`)."""
        return [from_args(cls, args, **fixed) for cls in self.config_classes()]
