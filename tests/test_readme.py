"""The README names only commands, options and make targets that exist.

Checked: every ``elastic-bench ...`` (and ``torchrun ... -m elastic_bench ...``) line of its bash blocks and every
inline code span that starts with ``elastic-bench``, with a command's name, with ``make`` or with an option. Command
words are followed down the parser of `elastic_bench.cli.build_parser`; every ``--flag`` (or ``-X``) must be an
option of the command reached; a word of ``a|b`` alternatives stands for each; ``...`` ends what is checked; the
words after ``lm-eval`` are lm-evaluation-harness's own.
"""

from __future__ import annotations

import argparse
import itertools
import re
import shlex
from pathlib import Path

import pytest

from elastic_bench.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDERS = ("...", "…")
# lm-evaluation-harness's own options, which the README names alone where `elastic-bench lm-eval` passes them on.
LM_EVAL_OPTIONS = {"--log_samples", "--use_cache"}


def _words(text: str) -> list[str]:
    """Shell words of ``text``, comments dropped (whitespace-split where the quoting is not shell's)."""
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return text.split()


def _fenced(text: str) -> tuple[list[str], str]:
    """``(the lines of the bash blocks with their continuations joined, the text outside every block)``."""
    lines, prose, block = [], [], None
    for line in text.splitlines():
        if line.startswith("```"):
            block = None if block is not None else line[3:].strip()
            continue
        if block is None:
            prose.append(line)
        elif block in ("bash", "sh", "shell"):
            if lines and lines[-1].endswith("\\"):
                lines[-1] = lines[-1][:-1] + " " + line.strip()
            else:
                lines.append(line)
    return lines, "\n".join(prose)


def named(text: str, commands: set[str]) -> tuple[list[list[str]], list[str], list[str]]:
    """What the Markdown ``text`` names: ``(the words after elastic-bench of each command, the make targets, the
    options named alone)``; ``commands`` are the top-level command names (a span may start with one)."""
    lines, prose = _fenced(text)
    runs, targets, options = [], [], []
    for words in map(_words, lines):
        if words[:1] == ["make"]:
            targets += words[1:2]
        for i, word in enumerate(words):
            if word == "elastic-bench" or (word == "elastic_bench" and words[i - 1] == "-m"):
                runs.append(words[i + 1:])
                break
    for span in re.findall(r"`([^`]+)`", prose):
        words = _words(" ".join(span.split()))
        if not words:
            continue
        if words[0] == "elastic-bench":
            runs.append(words[1:])
        elif words[0] in commands:
            runs.append(words)
        elif words[0] == "make":
            targets += words[1:2]
        elif words[0].startswith("--"):
            options.append(words[0].partition("=")[0])
    return runs, targets, options


def _expanded(words: list[str]) -> list[list[str]]:
    """One word list per choice of each ``a|b`` word (a lone ``|`` is a shell pipe: the words end there)."""
    if "|" in words:
        words = words[: words.index("|")]
    choices = [word.split("|") if "|" in word else [word] for word in words]
    return [list(combination) for combination in itertools.product(*choices)]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def problems(words: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """What in ``elastic-bench WORDS`` the ``parser`` does not have: unknown commands and options."""
    found, path = [], ["elastic-bench"]
    for word in words:
        if word in PLACEHOLDERS:
            break
        record = parser.get_default("command_record")
        if record is not None and record.passthrough:
            break
        if word.startswith("-"):
            option = word.partition("=")[0]
            if option not in parser._option_string_actions:
                found.append(f"{' '.join(path)}: no option {option}")
            continue
        below = _subcommands(parser)
        if below:
            if word not in below:
                found.append(f"{' '.join(path)}: no command {word}")
                break
            parser = below[word]
            path.append(word)
    return found


def make_targets(makefile: str) -> set[str]:
    """The targets of a Makefile's rules."""
    targets = set()
    for line in makefile.splitlines():
        rule = re.match(r"^([^\s:=#][^:=]*):(?!=)", line)
        if rule:
            targets.update(rule.group(1).split())
    return targets


def check(text: str, makefile: str) -> list[str]:
    """Every command, option and make target that the Markdown ``text`` names but that does not exist."""
    parser, _ = build_parser()
    top = _subcommands(parser)
    runs, targets, options = named(text, set(top))
    found = [p for words in runs for variant in _expanded(words) for p in problems(variant, parser)]
    found += [f"make: no target {t}" for t in targets if t not in make_targets(makefile)]
    everywhere = {o for p in [parser, *_all_parsers(parser)] for o in p._option_string_actions}
    found += [f"no command has the option {o}" for o in options if o not in everywhere | LM_EVAL_OPTIONS]
    return list(dict.fromkeys(found))


def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    below = list(_subcommands(parser).values())
    return below + [p for sub in below for p in _all_parsers(sub)]


@pytest.fixture(scope="module")
def makefile() -> str:
    return (ROOT / "Makefile").read_text()


def test_every_command_option_and_make_target_the_readme_names_exists(makefile):
    text = (ROOT / "README.md").read_text()
    runs, targets, options = named(text, set(_subcommands(build_parser()[0])))
    assert len(runs) > 20 and {"demo", "test"} <= set(targets) and options  # the README was read
    assert check(text, makefile) == []


@pytest.mark.parametrize("line,problem", [
    ("elastic-bench run --model M --no-such-flag 3", "elastic-bench run: no option --no-such-flag"),
    ("elastic-bench bench kernel --lengths 8K --steps 2", "elastic-bench bench kernel: no option --steps"),
    ("elastic-bench testbed train|nope --output tb", "elastic-bench testbed: no command nope"),
    ("torchrun --nproc-per-node 8 -m elastic_bench runs --limit 1", "elastic-bench: no command runs"),
    ("make demos", "make: no target demos"),
])
def test_a_name_that_does_not_exist_is_found(makefile, line, problem):
    assert check(f"```bash\n{line}  # a comment\n```\n", makefile) == [problem]


@pytest.mark.parametrize("prose,problem", [
    ("Run `elastic-bench report RUN_DIR --format pdf` to see it.", "elastic-bench report: no option --format"),
    ("See `train-router --no-such-option`.", "elastic-bench train-router: no option --no-such-option"),
    ("Give `--no-such-option 4` to any command.", "no command has the option --no-such-option"),
])
def test_inline_code_is_checked_too(makefile, prose, problem):
    assert check(prose, makefile) == [problem]


def test_what_may_stand_in_a_command_line_passes(makefile):
    text = ("```bash\nelastic-bench --debug ...\nelastic-bench lm-eval run --model elastic --anything 1\n"
            "elastic-bench testbed train|data --help\nelastic-bench methods | head\n```\n`make test`")
    assert check(text, makefile) == []
