"""Every option declared once: the parser of every command comes from its config dataclasses, values are type-checked
when parsed, and user errors end in one line."""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
import typing
from dataclasses import dataclass, field
from typing import Literal

import pytest

from elastic_bench import cli
from elastic_bench.foundation.commands import Command
from elastic_bench.foundation.options import add_options, check_fields, check_value, command_line, field_help, from_args

COMMAND_LEVEL = {"help", "config", "method_option"}  # options of the command line itself, not of a config


def _default(f: dataclasses.Field):
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default  # a required option: no default


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    """A config's fields by name, those of nested config dataclasses included."""
    hints = typing.get_type_hints(cls)
    found = {}
    for f in dataclasses.fields(cls):
        found |= _fields(hints[f.name]) if dataclasses.is_dataclass(hints[f.name]) else {f.name: f}
    return found


def test_every_option_default_is_its_dataclass_field_default():
    _, commands = cli.build_parser()
    declared = {c.name: c for c in cli.declared() if isinstance(c, Command)}
    assert set(commands) == set(declared)
    for name, p in commands.items():
        command = declared[name]
        fields = {k: f for cls in command.config_classes() for k, f in _fields(cls).items()}
        seen = set()
        for action in p._actions:
            if action.dest in COMMAND_LEVEL:
                continue
            assert action.dest in fields, f"`{name}` option {action.option_strings or action.dest} has no config field"
            default = command.defaults.get(action.dest, _default(fields[action.dest]))  # the command's, or the field's
            assert action.default == default, f"`{name}` --{action.dest}"
            assert action.help, f"`{name}` --{action.dest} has no help"
            seen.add(action.dest)
        skipped = set(command.skipped)
        assert seen | skipped == set(fields), f"`{name}`: fields without an option: {set(fields) - seen - skipped}"


@dataclass
class Inner:
    """Nested.

    Attributes:
        mode: which one.
        width: how wide.
    """

    mode: Literal["a", "b"] = "a"
    width: int = 8


@dataclass
class Example:
    """An example config.

    Attributes:
        name: a name.
        steps: optimiser steps; a long help that
            continues here.
        rate, decay: two numbers with one help.
        lengths: lengths in tokens.
        weights: task weights.
        pair: two floats.
        switch: off by default.
        on: on by default.
        limit: optional.
        inner: nested options.
    """

    name: str = "x"
    steps: int = 3
    rate: float = 0.5
    decay: float = 0.1
    lengths: list[int] = field(default_factory=lambda: [1024])
    weights: dict[str, float] = field(default_factory=lambda: {"a": 1.0})
    pair: tuple[float, float] | None = None
    switch: bool = False
    on: bool = True
    limit: int | None = None
    inner: Inner = field(default_factory=Inner)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_options(p, Example)
    return p


def test_help_comes_from_the_docstring():
    assert field_help(Example)["steps"] == "optimiser steps; a long help that continues here."
    assert field_help(Example)["rate"] == field_help(Example)["decay"] == "two numbers with one help."
    assert "(default: 3)" in _parser().format_help()


def test_parsed_values_are_typed_and_round_trip():
    args = _parser().parse_args(["--steps", "7", "--lengths", "4K,512,1M,2m", "--weights", "a=0.5,b=2", "--weights",
                                 "c=1", "--pair", "0.1,0.2", "--switch", "--no-on", "--mode", "b", "--width", "16"])
    config = from_args(Example, args)
    assert config == Example(steps=7, lengths=[4096, 512, 1024**2, 2 * 1024**2], weights={"a": 0.5, "b": 2.0, "c": 1.0},
                             pair=(0.1, 0.2), switch=True, on=False, inner=Inner("b", 16))
    again = from_args(Example, _parser().parse_args(shlex.split(shlex.join(command_line(Example, config)))))
    assert again == config
    assert command_line(Example, Example()) == []


@pytest.mark.parametrize("argv", [["--steps", "abc"], ["--lengths", "1K,x"], ["--weights", "a"], ["--mode", "c"],
                                  ["--pair", "1,2,3"], ["--rate", "fast"]])
def test_bad_values_are_rejected_when_parsed(argv):
    with pytest.raises(argparse.ArgumentError):
        _parser().parse_args(argv)


def test_values_from_files_are_checked_against_the_field_types():
    assert check_fields(Example, {"steps": 2, "rate": 1, "pair": [1, 2]}, "f.yaml") == {"steps": 2, "rate": 1.0,
                                                                                       "pair": (1.0, 2.0)}
    for bad, expected in [({"steps": "2"}, "steps must be an integer"), ({"lengths": ["4K"]}, "a list of integers"),
                          ({"switch": "yes"}, "true or false"), ({"inner": {"mode": "z"}}, "inner must be"),
                          ({"bogus": 1}, "unknown keys ['bogus']"), ({"steps": True}, "an integer")]:
        with pytest.raises(ValueError, match=re.escape(expected)):
            check_fields(Example, bad, "f.yaml")
    assert check_value(Example, "limit", None, "limit") is None


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["run", "-O", "streaming.local=abc", "--methods", "streaming"], "streaming.local must be an integer"),
        (["run", "--limit", "abc"], "--limit takes an integer"),
        (["run", "--backend", "bogus"], "unknown attention backend 'bogus'"),
        (["run", "--dtype", "fp8"], "invalid choice: 'fp8'"),
        (["testbed", "trian"], "invalid choice: 'trian'"),
        (["run", "-O", "elastic.mode=fa-zz", "--methods", "elastic"], "elastic.mode must be one of"),
    ],
)
def test_bad_command_lines_end_in_one_line(argv, expected, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and expected in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    "text,expected",
    [
        ('limit: "2"\n', 'limit must be an integer or null, got \'2\''),
        ("lengths: [4K]\n", "lengths must be a list of integers"),
        ("[1, 2]\n", "must hold a mapping of RunConfig fields"),
        ("model: [unclosed\n", "is not valid YAML"),
        ("bogus: 1\n", "unknown keys ['bogus']"),
    ],
)
def test_bad_config_files_end_in_one_line(tmp_path, capsys, text, expected):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    assert cli.main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and str(path) in err and len(err.splitlines()) == 1, err


def test_config_file_values_are_defaults_that_flags_override(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr("elastic_bench.evaluation.runner.run", lambda config: seen.setdefault("config", config) and [])
    path = tmp_path / "run.yaml"
    path.write_text("model: tiny:llama\nlimit: 5\nlengths: [512]\nmethods: [full, streaming]\n"
                    "method_options: {streaming: {local: 64, sink: 4}}\n")
    assert cli.main(["run", "--config", str(path), "--limit", "2", "-O", "streaming.local=32"]) == 0
    config = seen["config"]
    assert (config.model, config.limit, config.lengths) == ("tiny:llama", 2, [512])
    assert config.method_options == {"streaming": {"local": 32, "sink": 4}}


@dataclass
class Named:
    """A value that is a number or a name.

    Attributes:
        tau: a threshold, or ``paper`` / ``official``.
    """

    tau: float | Literal["paper", "official"] | None = None


def test_a_union_takes_the_first_type_that_fits():
    parser = argparse.ArgumentParser()
    add_options(parser, Named)
    assert parser.parse_args(["--tau", "0.8"]).tau == 0.8
    assert parser.parse_args(["--tau", "official"]).tau == "official"
    assert parser.parse_args(["--tau", "none"]).tau is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--tau", "offical"])
    assert check_value(Named, "tau", 1, "x") == 1.0 and check_value(Named, "tau", "paper", "x") == "paper"
    with pytest.raises(ValueError, match="x must be a number or one of 'paper', 'official' or null, got 'p'"):
        check_value(Named, "tau", "p", "x")
    from elastic_bench import get_method

    assert get_method("elastic", router="untrained", xa_threshold="official").overrides() == {"xa_threshold": 0.8}
