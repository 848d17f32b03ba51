"""The ``elastic-bench`` command line: it assembles the commands that each folder declares beside its code.

Each folder's light ``commands`` module lists its `elastic_bench.foundation.commands.Command` records (name, help,
handler, config classes); the options of a command come from its config dataclasses
(`elastic_bench.foundation.options`), whose classes are imported only for the command being parsed, so ``--help`` is
instant. Errors a user can cause (unknown names, bad values, missing files) end with one line on stderr and exit status
2, never a traceback; any other exception is a bug, reported in one line with exit status 1.
``elastic-bench --debug COMMAND ...`` re-raises both, with the full traceback. What can be checked without a model
(option values and ranges, devices, output paths, method knobs) is checked before any model loads.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from elastic_bench.foundation.commands import Command, Group
from elastic_bench.foundation.files import STORAGE_ERRNOS

# The modules whose ``COMMANDS`` make the command line, in the order of its command list.
MODULES = (
    "elastic_bench.evaluation.commands",
    "elastic_bench.bench.commands",
    "elastic_bench.method.commands",
    "elastic_bench.testbed.training.commands",
)


def declared() -> list[Command | Group]:
    """Every command and group, in the order of `MODULES`."""
    return [entry for module in MODULES for entry in importlib.import_module(module).COMMANDS]


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (the command's name, the error, where to look), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``elastic-bench`` parser, and the parser of each command by name (``"testbed train"``, ...).

    With ``argv``, only the command it names gets its arguments (the config classes of the others may import torch,
    and ``--help`` should be instant); without, every command does."""
    parser = _Parser(
        prog="elastic-bench",
        description="Evaluate long-context sparse-attention methods (Elastic Attention, DuoAttention, PruLong, "
        "XAttention, streaming, full) on real LLMs with official scoring and exact sparsity accounting.",
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (before the command: elastic-bench --debug run ...)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    words = [w for w in argv if not w.startswith("-")][:2] if argv is not None else None
    commands: dict[str, argparse.ArgumentParser] = {}
    for entry in declared():
        if isinstance(entry, Group):
            groups[entry.name] = sub.add_parser(entry.name, help=entry.help, description=entry.help).add_subparsers(
                dest="subcommand", required=True, metavar="SUBCOMMAND")
            continue
        group, _, leaf = entry.name.rpartition(" ")
        p = (groups[group] if group else sub).add_parser(leaf, help=entry.help, description=entry.description,
                                                         add_help=not entry.passthrough)
        p.set_defaults(command_record=entry)
        commands[entry.name] = p
        if words is None or words[: len(entry.name.split())] == entry.name.split():
            entry.add_arguments(p)
    return parser, commands


def _parse(argv: list[str]) -> argparse.Namespace:
    parser, commands = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    command: Command = args.command_record
    if command.passthrough:
        args.passthrough_args = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    elif command.file_defaults is not None and (values := command.file_defaults(args)):
        commands[command.name].set_defaults(**values)  # the file's values become the defaults the flags override
        args = parser.parse_args(argv)
    args.argv = argv
    return args


# Exceptions a user can cause (a bad value, a missing or unreadable file, an unknown name, a missing extra): one line,
# exit status 2. UnknownNameError is a ValueError; an OSError of a full disk or a read-only location is one too
# (`_user_error`).
USER_ERRORS = (ValueError, FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
               NotImplementedError, ImportError)


def _user_error(err: Exception) -> bool:
    return isinstance(err, USER_ERRORS) or (isinstance(err, OSError) and err.errno in STORAGE_ERRNOS)


def _debug_requested(argv: list[str]) -> bool:
    """Whether ``--debug`` comes before the command (the only place the top-level parser takes it)."""
    for word in argv:
        if not word.startswith("-"):
            return False
        if word == "--debug":
            return True
    return False


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` (default: ``sys.argv[1:]``) and return its exit status: 0 done, 1 some cells failed
    (or an internal error), 2 a user error (one line on stderr), 130 interrupted. With ``--debug`` before the
    command, errors re-raise with their traceback."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = _debug_requested(argv)
    try:
        args = _parse(argv)
        return args.command_record.handler(args.command_record, args)
    except KeyboardInterrupt:
        print("elastic-bench: interrupted; results written so far are kept", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of a listing went away (`elastic-bench methods | head`)
        sys.stderr.close()
        return 0
    except Exception as err:  # a user's error or a bug: one line, unless --debug asks for the traceback
        if debug:
            raise
        if _user_error(err):
            print(f"elastic-bench: error: {_one_line(err)}", file=sys.stderr)
            return 2
        print(f"elastic-bench: internal error: {type(err).__name__}: {_one_line(err)} (rerun with --debug for the "
              "traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
