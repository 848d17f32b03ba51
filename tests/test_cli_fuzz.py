"""Fuzzing the command line: seeded random malformed argument lists and ``--config`` files, built from the real
parser's options, must each end in exit status 2 with exactly one line on stderr (never a traceback), before any
model loads, and leave an existing results folder byte-identical.

Every case holds at least one input that is bad whatever the rest of the case says (a wrong-typed value, an unknown
option or name, a bad ``-O`` item, a malformed or ill-typed YAML file, a missing required option, an impossible
device or output path, an out-of-range value, a hostile learned file, a torchrun environment torchrun never sets), next
to random well-typed options of the same command. No case prints a traceback or an internal error.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import random
import sys
import types
import typing
from pathlib import Path

import pytest
import yaml

from elastic_bench import cli

CASES = 320  # and the lm-eval cases below
SEED = 2024
COMMANDS = ["run", "report", "compare", "bench kernel", "bench prefill", "bench decode", "records", "train-router",
            "train-duo", "train-prulong", "testbed train", "testbed data", "testbed eval", "testbed heads",
            "testbed probe", "methods", "tasks", "demo"]
WEIGHTS = [5, 2, 1, 1, 1.5, 1.5, 1.5, 2, 1, 1, 1, 1, 1, 1, 1, 0.5, 0.5, 1]  # how often each is drawn: run has most
FOLDER_OUTPUT = {"run", "train-router", "train-duo", "train-prulong", "testbed train", "report", "compare", "demo"}
FILE_OUTPUT = {"bench kernel", "bench prefill", "bench decode", "records", "testbed data", "testbed eval",
               "testbed heads"}  # --output is a file
RUN_FOLDERS = {"report": 1, "compare": 2}  # commands that take run folders as arguments: how many a case gives
# What each type of option is given when it is wrong (every one fails its option's conversion).
WRONG = {
    "an integer": ["abc", "1.5", "4KK", "1e3", "0x10", "K", "twelve"],
    "a number": ["abc", "1.2.3", "one", "0.5x", "1,5"],
    "a list of integers": ["1,x", "a,b", "4K,,y", "1.5"],
    "a list of numbers": ["x,y", "1,z", "a"],
    "a mapping NAME=a number": ["a", "=1", "a=x", "a=1,b", "a=1=2"],
}
# Out-of-range values that a command refuses before it loads a model: command -> [(flag, value)].
OUT_OF_RANGE = {
    "run": [("--limit", "0"), ("--lengths", "0"), ("--lengths", "640,-8"), ("--backend", "bogus")],
    "bench kernel": [("--seed", "-5"), ("--cells", "bogus")],
    "bench prefill": [("--omega-msr", "1.5"), ("--density", "0"), ("--repeats", "0"), ("--seed", "-1"),
                      ("--lengths", "0"), ("--methods", "nope"), ("--backend", "bogus"), ("--router", "/no/such"),
                      ("--pattern", "/no/such")],
    "bench decode": [("--omega-msr", "2"), ("--kv-caches", "bogus"), ("--steps", "0"), ("--warmup", "-1"),
                     ("--bandwidth", "-1"), ("--max-memory", "0"), ("--generate", "0"), ("--methods", "nope"),
                     ("--lengths", "1"), ("--seed", "-1"), ("--router", "/no/such"), ("--backend", "bogus")],
    "records": [("--samples", "0"), ("--min-length", "0"), ("--max-length", "-1"), ("--lengths", "0"),
                ("--tasks", "nope"), ("--seed", "-1"), ("--corpus", "/no/such"), ("--model", "nope"),
                ("--lengths", "99999999")],
    "train-router": [("--seed", "-5"), ("--steps", "0"), ("--max-minutes", "-1"), ("--xa-threshold", "2")],
    "train-duo": [("--steps", "0"), ("--initial-value", "2"), ("--num-passkeys", "30"), ("--min-depth", "-1")],
    "train-prulong": [("--target", "1"), ("--batch-size", "0"), ("--sparsity-warmup", "2"), ("--local-window", "0")],
    "testbed train": [("--seed", "-5"), ("--steps", "0"), ("--max-minutes", "-3"), ("--task-weights", "nope=1")],
    "testbed data": [("--samples", "0"), ("--seed", "-5"), ("--lengths", "-1")],
    "testbed eval": [("--samples", "0"), ("--local", "0"), ("--sink", "-1"), ("--lengths", "0")],
    "testbed heads": [("--samples", "-2"), ("--length", "0"), ("--tasks", "nope")],
    "testbed probe": [("--samples", "0"), ("--length", "0")],
    "report": [("--protocol", "bogus"), ("--delta", "-1")],
    "compare": [("--protocol", "Paper")],
    "demo": [("--limit", "0"), ("--lengths", "0"), ("--lengths", "1K,-1")],
}
# Learned files a hostile or careless user hands a method (made by the `paths` fixture): each refused before the model
# loads. method -> [(option, file)].
HOSTILE_FILES = {"elastic": [("router", "router-format-99"), ("router", "router-huge-block"),
                             ("router", "router-sink-negative")],
                 "duo_attention": [("pattern", "gates-words.tsv"), ("pattern", "gates-nan.tsv")]}
# torchrun environments torchrun never sets, for the commands that read it before anything else of weight.
BAD_ENVIRONMENTS = [{"WORLD_SIZE": "two"}, {"WORLD_SIZE": "2"}, {"WORLD_SIZE": "2", "RANK": "5"},
                    {"WORLD_SIZE": "-1"}, {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "x"}]
READS_TORCHRUN = {"train-duo", "train-prulong", "bench prefill"}
BAD_DEVICES = ["gpu", "cuda:999", "cuda:-1", "", "cuda:x", "tpu:0", "CPU", " cpu"]
BAD_METHOD_OPTIONS = [
    "streaming.local", "streaminglocal=3", ".local=3", "streaming.=3", "=", "", "streaming.local=abc",
    "streaming.local=[1, 2", "streaming.local=0", "streaming.sink=-1", "nope.x=1", "full.x=1", "streaming.bogus=1",
    "elastic.router=/no/such/router", "xattention.stride=0", "duo_attention.sparsity=1.5", "elastic.xa_threshold=2",
    "streaming.granularity=pixel", "streaming.sparse_decode=maybe",
]
YAML_SYNTAX_ERRORS = ["model: [unclosed\n", "a: b: c\n", "\t- x\n", "{\n", "methods: [full,\n", "key: 'open\n",
                      "- a\nb: c\n", "\x00\x01binary\n"]
YAML_NOT_A_MAPPING = ["- 1\n- 2\n", "just a string\n", "42\n", "[full, streaming]\n"]


@dataclasses.dataclass
class Option:
    """One option of a command's parser."""

    flag: str
    forms: list[str]  # every spelling (a switch defaulting to True also has a --no- form)
    dest: str
    kind: str  # the parser's type name ("an integer", ...), "choice", "switch", "string" or "special"
    choices: list[str] | None
    required: bool


def command_options() -> dict[str, list[Option]]:
    """The options of every fuzzed command, read from the real parser."""
    _, parsers = cli.build_parser()
    found: dict[str, list[Option]] = {"methods": [], "tasks": []}
    for name in COMMANDS:
        if name in found:
            continue
        options = []
        for action in parsers[name]._actions:
            if isinstance(action, argparse._HelpAction) or not action.option_strings:
                continue
            if action.dest in ("config", "method_option"):
                kind = "special"
            elif action.nargs == 0:
                kind = "switch"
            elif action.choices:
                kind = "choice"
            else:
                kind = getattr(action.type, "__name__", "a string")
                kind = kind if kind in WRONG else "string"
            options.append(Option(action.option_strings[0], list(action.option_strings), action.dest, kind,
                                  list(action.choices) if action.choices else None, action.required))
        found[name] = options
    return found


def well_typed(rng: random.Random, command: str, option: Option, paths: dict[str, Path]) -> list[str]:
    """``option`` with a value of its type (plausible, not necessarily accepted by the command)."""
    if option.kind == "switch":
        return [rng.choice(option.forms)]
    if option.kind == "choice":
        return [option.flag, rng.choice(option.choices)]
    if option.kind == "an integer":
        return [option.flag, rng.choice(["1", "2", "16", "640", "1K"])]
    if option.kind == "a number":
        return [option.flag, rng.choice(["0.5", "1", "0.25", "0.9"])]
    if option.kind == "a list of integers":
        return [option.flag, rng.choice(["640", "1K,2K", "512"])]
    if option.kind == "a list of numbers":
        return [option.flag, rng.choice(["0.9,0.95", "0.5,0.5"])]
    if option.kind == "a mapping NAME=a number":
        return [option.flag, rng.choice(["sensitive=0.5", "robust=1", "niah_single=1"])]
    values = {
        "model": ["tiny:qwen3", "tiny:llama", "testbed"], "methods": ["full", "full,streaming", "streaming"],
        "tasks": {"run": ["ruler_niah_single_1"], "records": ["passkey"]}.get(
            command, ["niah_single", "niah_single,niah_multikey"]),
        "kv_caches": ["evicting", "full,dynamic"], "router": ["untrained"],
        "device": ["cpu"], "data": ["synthetic"], "cells": ["dense", "dense,streaming"], "backends": ["reference"],
        "backend": ["auto", "reference"], "data_dir": [str(paths["scratch"] / "data")],
        "output": [str(paths["results"])] if command == "run" else [str(paths["scratch"] / "out")],
    }
    return [option.flag, rng.choice(values.get(option.dest, ["x", "none"]))]


def bad_yaml(rng: random.Random, path: Path) -> None:
    """A RunConfig file that is malformed, not a mapping, or holds an unknown key or an ill-typed value."""
    from elastic_bench.evaluation.runner import RunConfig

    kind = rng.choice(["syntax", "not a mapping", "unknown key", "ill-typed", "ill-typed"])
    if kind == "syntax":
        path.write_bytes(rng.choice(YAML_SYNTAX_ERRORS).encode())
        return
    if kind == "not a mapping":
        path.write_text(rng.choice(YAML_NOT_A_MAPPING))
        return
    data: dict = {"model": "tiny:qwen3", "limit": 1} if rng.random() < 0.5 else {}
    if kind == "unknown key":
        data[rng.choice(["bogus", "method", "length", "Limit", "output_dir"])] = 1
    else:
        hints = typing.get_type_hints(RunConfig)
        for name in rng.sample(sorted(hints), rng.randint(1, 3)):
            data[name] = rng.choice(ill_typed(hints[name]))
    path.write_text(yaml.safe_dump(data))


def ill_typed(tp) -> list:
    """YAML values that do not match the field type ``tp``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    origin = typing.get_origin(tp)
    if tp is bool:
        return ["yes", 1, [True]]
    if tp is int:
        return ["abc", "2", 1.5, True, [1]]
    if tp is str:
        return [5, ["x"], {"a": 1}, 1.5]
    if origin is typing.Literal:
        return ["fp8", 3, ["bfloat16"]]
    if origin is list and typing.get_args(tp)[0] is int:
        return [["4K"], "640", [1.5], {"a": 1}]
    if origin is list:
        return ["full", [1], {"a": 1}]
    if origin is dict:
        return [[1], "x", {"streaming": 3}, {"streaming": {"local": "abc"}}, {"nope": {"x": 1}}]
    return [object()]


def make_case(rng: random.Random, command: str, options: list[Option], paths: dict[str, Path], index: int):
    """One malformed command line of ``command`` (its words, one or two bad inputs and random well-typed options) and
    the environment it runs in (a torchrun environment torchrun never sets is one of the bad inputs)."""
    by_dest = {o.dest: o for o in options}
    kinds = ["unknown option", "stray argument"]  # argparse refuses these first: drawn less than the rest
    if any(o.kind in WRONG for o in options):
        kinds += ["wrong type"] * 2
    if any(o.kind == "choice" for o in options):
        kinds.append("bad choice")
    if any(o.kind == "switch" for o in options) and command not in RUN_FOLDERS:
        kinds.append("switch with a value")
    if any(o.required for o in options) or command in RUN_FOLDERS:
        kinds.append("missing required")
    if "device" in by_dest:
        kinds += ["device"] * 2
    if command in FOLDER_OUTPUT | FILE_OUTPUT:
        kinds += ["output"] * 2
    if command in OUT_OF_RANGE:
        kinds += ["out of range"] * 3
    if command == "run":
        kinds += ["-O"] * 4 + ["yaml"] * 4 + ["unknown name"] * 2 + ["missing config"] + ["learned file"] * 2
    if command in READS_TORCHRUN:
        kinds += ["environment"] * 2
    if command in RUN_FOLDERS:
        kinds += ["bad run folder"] * 3
    bad: list[list[str]] = []
    environment: dict[str, str] = {}
    taken: set[str] = set()  # options the bad inputs set: the well-typed ones must not override them
    drop_required = False
    run_dirs = [str(paths["results"])] * RUN_FOLDERS.get(command, 0)
    for kind in rng.sample(kinds, min(len(kinds), rng.choice([1, 1, 1, 2]))):
        if kind == "unknown option":
            word = rng.choice(["bogus", "frobnicate", "lenghts", "method", "verbose-mode", "x"])
            bad.append([f"--{word}-{index}"] + ([rng.choice(["1", "x"])] if rng.random() < 0.5 else []))
        elif kind == "stray argument":
            bad.append([rng.choice(["stray", "extra", "1"])])
        elif kind == "wrong type" and (free := [o for o in options if o.kind in WRONG and o.dest not in taken]):
            option = rng.choice(free)
            bad.append([option.flag, rng.choice(WRONG[option.kind])])
            taken.add(option.dest)
        elif kind == "bad choice":
            option = rng.choice([o for o in options if o.kind == "choice"])
            bad.append([option.flag, rng.choice(["fp8", "none", "FULL", "bogus"])])
            taken.add(option.dest)
        elif kind == "switch with a value":
            option = rng.choice([o for o in options if o.kind == "switch"])
            bad.append([option.flag, rng.choice(["yes", "no", "maybe"])])
        elif kind == "missing required":
            drop_required = True
            run_dirs = []
        elif kind == "device" and "device" not in taken:
            bad.append(["--device", rng.choice(BAD_DEVICES)])
            taken.add("device")
        elif kind == "output" and "output" not in taken:
            target = paths["file"] if command in FOLDER_OUTPUT else paths["folder"]
            bad.append(["--output", str(rng.choice([target, target / "inside"] if target.is_file() else [target]))])
            taken.add("output")
        elif kind == "out of range":
            flag, value = rng.choice(OUT_OF_RANGE[command])
            dest = flag[2:].replace("-", "_")
            if dest not in taken:
                bad.append([flag, value])
                taken.add(dest)
        elif kind == "-O":
            bad.append(["-O", rng.choice(BAD_METHOD_OPTIONS)])
        elif kind == "yaml":
            config = paths["scratch"] / f"config-{index}.yaml"
            bad_yaml(rng, config)
            bad.append(["--config", str(config)])
        elif kind == "missing config":
            bad.append(["--config", str(paths["scratch"] / "absent.yaml")])
        elif kind == "unknown name" and not taken & {"methods", "tasks"}:
            option = rng.choice(["--methods", "--tasks"])
            bad.append([option, rng.choice(["full,nope", "nope", "strea ming", "ruler_nope"])])
            taken.add(option[2:])
        elif kind == "learned file" and "methods" not in taken:
            method = rng.choice(sorted(HOSTILE_FILES))
            option, name = rng.choice(HOSTILE_FILES[method])
            bad.append(["--methods", method, "-O", f"{method}.{option}={paths['scratch'] / name}"])
            taken.add("methods")
        elif kind == "environment":
            environment = rng.choice(BAD_ENVIRONMENTS)
        elif kind == "bad run folder" and run_dirs:
            run_dirs[-1] = str(rng.choice([paths["scratch"] / "absent", paths["file"], paths["empty"]]))
    if not bad and not drop_required and not environment:  # every kind drawn was taken: an unknown option
        bad.append([f"--bogus-{index}"])
    filler = [o for o in options if o.dest not in taken and o.kind != "special" and not o.required]
    pieces = [well_typed(rng, command, o, paths) for o in rng.sample(filler, min(len(filler), rng.randint(0, 4)))]
    if not drop_required:
        pieces += [well_typed(rng, command, o, paths) for o in options if o.required and o.dest not in taken]
    pieces += bad
    rng.shuffle(pieces)
    return command.split() + run_dirs + [w for piece in pieces for w in piece], environment


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, Path]:
    """A results folder made by one tiny run, an existing file, an existing folder, an empty folder, a scratch
    folder."""
    root = tmp_path_factory.mktemp("fuzz")
    results = root / "results"
    argv = ["run", "--model", "tiny:qwen3", "--methods", "full", "--tasks", "ruler_niah_single_1", "--lengths", "640",
            "--limit", "1", "--no-progress", "--device", "cpu", "--output", str(results)]
    assert cli.main(argv) == 0
    (root / "a-file.txt").write_text("not a folder")
    for name in ("a-folder", "empty", "scratch"):
        (root / name).mkdir()
    hostile_files(root / "scratch")
    return {"results": results, "file": root / "a-file.txt", "folder": root / "a-folder", "empty": root / "empty",
            "scratch": root / "scratch"}


def hostile_files(folder: Path) -> None:
    """The learned files of `HOSTILE_FILES` in ``folder``: routers whose configs are of another format or out of range,
    gate tables that are not numbers or not finite."""
    from elastic_bench.method import RouterConfig, save_routers

    for name, change in (("router-format-99", {"format_version": 99}),
                         ("router-huge-block", {"attention": {"block_size": 1 << 30}}),
                         ("router-sink-negative", {"attention": {"sink": -1}})):
        router = save_routers(RouterConfig(2, 2, 16).build(), folder / name)
        config = json.loads((router / "router_config.json").read_text())
        (router / "router_config.json").write_text(json.dumps({**config, **change}))
    (folder / "gates-words.tsv").write_text("full\tstreaming\n1\t0\n")
    (folder / "gates-nan.tsv").write_text("nan\t1\n1\t0\n")


class Reached(BaseException):
    """Raised where a case would start real work; main() does not catch it, so the test names the case."""


def test_malformed_command_lines_end_in_one_line_before_any_model_loads(paths, capsys, monkeypatch):
    def reached(what):
        def stop(*args, **kwargs):
            raise Reached(what)

        return stop

    for target in ("elastic_bench.modeling.loading.load_model", "elastic_bench.evaluation.runner.run",
                   "elastic_bench.method.trainer.train", "elastic_bench.method.router_records.router_records",
                   "elastic_bench.testbed.training.train.train", "elastic_bench.kernels.bench.run_kernel_bench",
                   "elastic_bench.testbed.training.records.write_records", "elastic_bench.reports.write_report"):
        monkeypatch.setattr(target, reached(target))
    before = digest(paths["results"])
    options = command_options()
    rng = random.Random(SEED)
    failures = []
    capsys.readouterr()
    for index in range(CASES):
        command = COMMANDS[index] if index < len(COMMANDS) else rng.choices(COMMANDS, WEIGHTS)[0]
        argv, environment = make_case(rng, command, options[command], paths, index)
        with monkeypatch.context() as case:
            for name, value in environment.items():
                case.setenv(name, value)
            code, out, err = outcome(argv, capsys)
        argv = [*(f"{k}={v}" for k, v in environment.items()), *argv]
        if isinstance(code, str):
            failures.append(f"{argv}: {code} (the case was not refused)")
            continue
        lines = err.strip().splitlines()
        if code != 2 or len(lines) != 1 or "Traceback" in err + out or "internal error" in err:
            failures.append(f"{argv}: exit {code}, stderr {err!r}")
        if digest(paths["results"]) != before:
            failures.append(f"{argv}: changed the results folder")
            before = digest(paths["results"])
    assert not any(paths["scratch"].glob("out*")) and not any(paths["folder"].iterdir())
    assert not failures, f"{len(failures)} of {CASES} cases:\n" + "\n".join(failures)


def outcome(argv: list[str], capsys) -> tuple[int | str | None, str, str]:
    """``elastic-bench ARGV`` run in-process: its exit status (argparse's own too), stdout and stderr; the status is
    ``"reached X"`` where the case got as far as X, a patched model load or the work itself (`Reached`)."""
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    except Reached as stop:
        capsys.readouterr()  # what it printed on the way is not the next case's
        return f"reached {stop}", "", ""
    out, err = capsys.readouterr()
    return code, out, err


# ``lm-eval``'s arguments are lm-eval's own and the `elastic` model's: every error among them, lm-eval's parser's, its
# configuration's and task list's as well as the model's arguments, ends in one line before any model loads (nothing
# lm-eval prints or logs meanwhile comes out).
LM_EVAL_FIXTURES = Path(__file__).parent / "fixtures" / "lm_eval"
LM_EVAL_MODEL = ["run", "--model", "elastic", "--tasks", "toy_generate", "--model_args"]
LM_EVAL_CASES = [
    ["run", "--model", "elastic", "--bogus-option"],
    ["bogus-command"],
    ["run", "--model", "elastic", "--model_args", "pretrained=tiny:llama", "--seed", "x"],
    ["ls", "bogus"],
    ["run", "--model", "elastic", "--model_args", "pretrained=tiny:llama"],  # no task
    ["run", "--model", "elastic", "--model_args", "pretrained=tiny:llama", "--tasks", "no_such_task", "--limit", "2"],
    [*LM_EVAL_MODEL, "pretrained=tiny:llama", "--device", "gpu"],
    ["run", "--config", "{absent}"],
    ["run", "--config", "{not_a_mapping}"],
    *([*LM_EVAL_MODEL, f"pretrained=tiny:llama,{args}"]
      for args in ("methd=streaming", "method=nope", "method=streaming,method_local=many", "dtype=float33",
                   "method=streaming,method_local=0", "tp=2", "tp=two", "tp=0", "kernel_backend=triton",
                   "kernel_backend=bogus", "device=cpu", "batch_size=2", "parallelize=true")),
    *([*LM_EVAL_MODEL, f"pretrained={spec}"] for spec in ("./no-such-model", "/no/such/model", "someorg/absent-model")),
]


def test_malformed_lm_eval_command_lines_end_in_one_line_before_any_model_loads(paths, capsys, monkeypatch):
    pytest.importorskip("lm_eval")
    import lm_eval

    from elastic_bench.evaluation import lm_eval_bridge

    def reached(*args, **kwargs):
        raise Reached("load_model or simple_evaluate")

    monkeypatch.setattr(lm_eval_bridge, "load_model", reached)
    monkeypatch.setattr(lm_eval, "simple_evaluate", reached)
    monkeypatch.setattr("sys.argv", list(sys.argv))  # the bridge hands lm-eval its arguments through sys.argv
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a hub id is looked up in the local cache only
    configs = {"absent": paths["scratch"] / "absent.yaml", "not_a_mapping": paths["scratch"] / "lm-eval-list.yaml"}
    configs["not_a_mapping"].write_text("- model\n- elastic\n")
    before = digest(paths["results"])
    failures = []
    for case in LM_EVAL_CASES:
        argv = ["lm-eval", *(word.format(**configs) for word in case), "--include_path", str(LM_EVAL_FIXTURES),
                "--output_path", str(paths["scratch"] / "lm-eval")]
        code, out, err = outcome(argv, capsys)
        if isinstance(code, str):
            failures.append(f"{argv}: {code} (the case was not refused)")
            continue
        lines = err.strip().splitlines()
        if code != 2 or out or len(lines) != 1 or not lines[0].startswith("elastic-bench: error: "):
            failures.append(f"{argv}: exit {code}, stdout {out!r}, stderr {err!r}")
    assert digest(paths["results"]) == before and not (paths["scratch"] / "lm-eval").exists()
    assert not failures, "\n".join(failures)
