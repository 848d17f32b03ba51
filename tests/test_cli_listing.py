"""The command line's commands and options are those recorded in tests/fixtures/cli_listing.json, and its help needs
no torch."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from elastic_bench.cli import build_parser

FIXTURE = Path(__file__).parent / "fixtures" / "cli_listing.json"


def listing(parser: argparse.ArgumentParser, name: str, found: dict) -> dict:
    """``found`` with, for ``parser`` (named ``name``) and each parser below it, its sorted option strings (the
    spellings of one option joined by a space), positional names and subcommand names."""
    entry = {"options": [], "positional": [], "commands": []}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            entry["commands"] = sorted(action.choices)
            for sub, subparser in action.choices.items():
                listing(subparser, f"{name} {sub}", found)
        elif action.option_strings:
            entry["options"].append(" ".join(sorted(action.option_strings)))
        else:
            entry["positional"].append(action.dest)
    entry["options"].sort()
    found[name] = entry
    return found


def test_every_command_and_option_is_the_recorded_one():
    recorded = json.loads(FIXTURE.read_text())
    found = listing(build_parser()[0], "elastic-bench", {})
    assert sorted(found) == sorted(recorded)
    for name, entry in recorded.items():
        assert found[name] == entry, name


def test_help_imports_no_torch():
    code = ("import contextlib, io, sys\n"
            "from elastic_bench.cli import main\n"
            "for argv in (['--help'], ['bench', '--help'], ['report', '--help'], ['testbed', 'data', '--help']):\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "        main(argv)\n"
            "sys.exit('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:] or "elastic-bench --help imported torch"
