"""The evaluation commands: ``run``, ``demo``, ``report``, ``compare``, ``methods``, ``tasks`` and ``lm-eval``
(`elastic_bench.foundation.commands` records; their heavy imports happen inside the handlers).

``report`` and ``compare`` render with `elastic_bench.reports`; they are declared here because importing that
package loads pandas and seaborn, which ``elastic-bench --help`` must not wait for.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import shutil
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_bench.foundation.commands import Command
from elastic_bench.foundation.options import check_at_least, check_folder_output, check_lengths, field_help
from elastic_bench.testbed import STREAMING_LOCAL, STREAMING_SINK


@dataclass
class DemoConfig:
    """``elastic-bench demo``: every registered method on the testbed tasks with the shipped testbed model.

    Attributes:
        output: run folder.
        limit: samples per task and length.
        lengths: comma-separated lengths in tokens.
    """

    output: str = "runs/demo"
    limit: int = 3
    lengths: list[int] = field(default_factory=lambda: [1024, 2048, 4096])

    def __post_init__(self):
        check_at_least("--limit", self.limit, 1)
        check_lengths("--lengths", self.lengths)
        check_folder_output(self.output)


@dataclass
class MethodsConfig:
    """``elastic-bench methods``.

    Attributes:
        preset: print what this settings preset sets (elastic-paper, upstream, official-code): every option, its value
            and its source.
    """

    preset: str | None = None

    def __post_init__(self):
        if self.preset is not None:
            from elastic_bench.evaluation.presets import get_preset

            get_preset(self.preset)


@dataclass
class ReportConfig:
    """``elastic-bench report``.

    Attributes:
        run_dir: the run folder (the --output of `elastic-bench run`).
        output: folder for the report files (none: RUN_DIR/report).
        delta: δ in score points of the "sparsity within δ of full attention" table: per method and task category,
            the largest ΩESR whose score stays within δ of full attention (paired bootstrap, 95%).
    """

    run_dir: str
    output: str | None = None
    delta: float = 1.0  # elastic_bench.reports.free_sparsity.DELTA

    def __post_init__(self):
        if self.output is not None:
            check_folder_output(self.output)
        if self.delta < 0:
            raise ValueError(f"--delta must be >= 0 score points, got {self.delta}")


@dataclass
class CompareConfig:
    """``elastic-bench compare``.

    Attributes:
        runs: two or more run folders (each the --output of `elastic-bench run`), side by side.
        output: folder for the comparison files (none: compare-RUN_A-RUN_B… beside RUN_A).
    """

    runs: list[str]
    output: str | None = None

    def __post_init__(self):
        if len(self.runs) < 2:
            raise ValueError(f"compare needs two or more run folders, got {len(self.runs)}")
        resolved = [Path(r).resolve() for r in self.runs]
        if len(set(resolved)) < len(resolved):
            raise ValueError(f"a run folder is given twice: {' '.join(self.runs)}")
        if self.output is not None:
            check_folder_output(self.output)


# ---- run ---------------------------------------------------------------------------------------------------------


def _run(command: Command, args: argparse.Namespace) -> int:
    from elastic_bench.evaluation.runner import run
    from elastic_bench.evaluation.terminal import format_rows

    # The checks that need no torch come first: the output folder, then RunConfig's own (names, values) before its
    # backend and method checks import torch, then the device.
    check_folder_output(args.output)
    (config,) = command.configs_from(args, method_options=_merged_method_options(args))
    from elastic_bench.modeling.loading import check_device

    check_device(config.device)
    rows = run(config)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for the run
        print(format_rows(rows, config.output))
    return 0 if all(r["status"] == "complete" for r in rows) else 1


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML file of RunConfig fields; flags given with it override its values")
    parser.add_argument("-O", "--method-option", action="append", default=[], metavar="METHOD.OPTION=VALUE",
                        help="a method knob, e.g. -O streaming.local=256 (repeatable; see `elastic-bench methods`)")
    parser.set_defaults(method_options={})


def _run_file_defaults(args: argparse.Namespace) -> dict[str, Any]:
    from elastic_bench.evaluation.runner import RunConfig

    return RunConfig.from_yaml(args.config) if args.config else {}


def _method_options(items: list[str]) -> dict[str, dict[str, Any]]:
    """``-O METHOD.OPTION=VALUE`` items as ``{method: {option: value}}`` (values read as YAML scalars).

    Raises:
        ValueError: an item is not ``METHOD.OPTION=VALUE``, or one option is given two different values (a run holds
            one configuration per method: a sweep is one ``run`` per value into the same folder).
    """
    import yaml

    options: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        method, dot, option = key.partition(".")
        if not sep or not dot or not option:
            raise ValueError(f"method options look like METHOD.OPTION=VALUE (e.g. streaming.local=256); got {item!r}")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        given = options.setdefault(method, {})
        if option in given and given[option] != value:
            raise ValueError(f"-O {key} is given twice ({given[option]!r}, then {value!r}); a run evaluates one "
                             f"value per option: for a sweep, run once per value into the same --output")
        given[option] = value
    return options


def _merged_method_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The method options of ``--config`` updated with the ``-O`` items."""
    merged = {name: dict(values) for name, values in args.method_options.items()}
    for name, values in _method_options(args.method_option).items():
        merged.setdefault(name, {}).update(values)
    return merged


# ---- demo, report, compare ---------------------------------------------------------------------------------------


def _demo(command: Command, args: argparse.Namespace) -> int:
    (demo,) = command.configs_from(args)  # checked before the imports below, which take seconds
    from elastic_bench.evaluation.runner import RunConfig, run
    from elastic_bench.evaluation.terminal import format_rows
    from elastic_bench.modeling.interface import method_names
    from elastic_bench.modeling.loading import TESTBED_DIR
    from elastic_bench.reports import load_cells, summarize, write_report

    # The testbed ships its retrieval-head gates (duo_attention / prulong find them) and its router (elastic).
    config = RunConfig(
        model="testbed", methods=method_names(),
        method_options={"streaming": {"sink": STREAMING_SINK, "local": STREAMING_LOCAL}}, tasks=["testbed"],
        lengths=demo.lengths, limit=demo.limit, output=demo.output,
    )
    rows = run(config)
    print(format_rows(rows, config.output))
    report = Path(config.output) / "report"
    cells = load_cells(config.output, aggregations=official_aggregation)
    write_report(summarize(cells), report, source=str(config.output))
    print(f"demo results written to {config.output}; report: {report / 'report.html'} and {report / 'report.md'}")
    # The router target sweep that chose the shipped router (H200, 50 samples per cell; docs/testbed.md), precomputed:
    # its frontier places a router per target among the static baselines.
    sweep = Path(config.output) / "sweep_report"
    write_report(summarize(load_cells(TESTBED_DIR / "sweep_run", aggregations=official_aggregation)), sweep,
                 source="the testbed's router target sweep (elastic_bench/data/testbed/sweep_run, one H200)")
    print(f"router target sweep (precomputed): {sweep / 'report.html'} and {sweep / 'report.md'}")
    return 0 if all(r["status"] == "complete" for r in rows) else 1


def official_aggregation(task: str):
    """The official aggregation of a registered task's per-sample records (None for a task no longer registered):
    the reports recompute a complete cell's scores with it (`elastic_bench.reports.load_cells`)."""
    from elastic_bench import tasks

    return tasks.get(task).aggregate if task in tasks.names() else None


def _report(command: Command, args: argparse.Namespace) -> int:
    from elastic_bench.reports import load_cells, summarize, write_report

    (config,) = command.configs_from(args)
    output = Path(config.output) if config.output else Path(config.run_dir) / "report"
    check_folder_output(output, "--output" if config.output else "the report folder")
    cells = load_cells(config.run_dir, aggregations=official_aggregation)
    written = write_report(summarize(cells), output, source=config.run_dir, delta=config.delta)
    print(f"report written to {output / 'report.html'} and {output / 'report.md'} ({len(written)} files)")
    return 0


def _compare(command: Command, args: argparse.Namespace) -> int:
    (config,) = command.configs_from(args)  # checked before the reports' imports, which take seconds
    from elastic_bench.reports import compare, load_cells, run_names, write_report

    names = run_names(config.runs)
    cells = [c for run, name in zip(config.runs, names)
             for c in load_cells(run, run=name, aggregations=official_aggregation)]
    output = Path(config.output) if config.output else Path(config.runs[0]).parent / "-".join(["compare", *names])
    check_folder_output(output, "--output" if config.output else "the comparison folder")
    written = write_report(compare(cells), output, source=", ".join(config.runs))
    print(f"comparison written to {output / 'report.html'} and {output / 'report.md'} ({len(written)} files)")
    return 0


# ---- listings, lm-eval -------------------------------------------------------------------------------------------


def plain(text: str) -> str:
    """``text`` without the reStructuredText markup of docstrings: ````code```` and ```name``` lose their
    backticks, the content stays."""
    return re.sub(r"``(.+?)``|`([^`]+)`", lambda m: m.group(1) or m.group(2), text)


def _summary(doc: str | None) -> str:
    """The first sentence of a docstring, as plain text on one line."""
    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    return plain(re.split(r"(?<=\.)\s+(?=[A-Z])", paragraph, maxsplit=1)[0])


def _yaml_scalar(value: Any) -> str:
    """``value`` spelt as ``-O METHOD.OPTION=VALUE`` reads it (a YAML scalar; a mapping as ``NAME=VALUE,...``, as a
    ``dict`` option reads it)."""
    if isinstance(value, dict):
        return ",".join(f"{k}={_yaml_scalar(v)}" for k, v in value.items())
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def _width() -> int:
    """The terminal's width, 120 when the output is not a terminal."""
    return shutil.get_terminal_size((120, 24)).columns


def aligned(rows: list[tuple[str, ...]], indent: int = 0, widths: list[int] | None = None) -> list[str]:
    """``rows`` as lines of aligned columns (two spaces apart, ``widths`` or the widest cell of each column but the
    last), the last column wrapped to the terminal's width (120 when not a terminal) under itself."""
    widths = widths or [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    room = _width()
    lines = []
    for row in rows:
        head = " " * indent + "".join(cell.ljust(width + 2) for cell, width in zip(row, widths))
        wrapped = textwrap.wrap(row[-1], max(room - len(head), 40)) or [""]
        lines += [head + wrapped[0], *(" " * len(head) + line for line in wrapped[1:])]
    return lines


def _list_methods(command: Command, args: argparse.Namespace) -> int:
    (config,) = command.configs_from(args)
    if config.preset is not None:
        return _list_preset(config.preset)
    from elastic_bench.modeling.interface import REGISTRY, method_names

    classes = {name: REGISTRY.get(name) for name in method_names()}
    knobs = {name: [(f.name, _yaml_scalar(f.default), plain(field_help(cls).get(f.name, "")))
                    for f in dataclasses.fields(cls)] for name, cls in classes.items()}
    knob_widths = [max((len(row[i]) for rows in knobs.values() for row in rows), default=0) for i in range(2)]
    method_width = [max(map(len, classes))]
    for name, cls in classes.items():
        print("\n".join(aligned([(name, _summary(cls.__doc__))], widths=method_width)))
        if knobs[name]:
            print("\n".join(aligned(knobs[name], indent=4, widths=knob_widths)))
    note = ("Set an option with elastic-bench run -O METHOD.OPTION=VALUE (e.g. -O streaming.local=256); values are "
            "read as YAML scalars (null, true, 0.5, text). Every method plans a model's full softmax-attention layers "
            "(MLA's included): a sliding-window layer keeps the model's own window and a linear-attention layer has "
            "no attention to plan (a cell records them as layer_kinds and routed_layers; docs/architectures.md).")
    print("\n" + textwrap.fill(note, _width()))
    return 0


def _list_preset(name: str) -> int:
    """Print what the preset ``name`` sets: its run options as ``-O METHOD.OPTION=VALUE`` would, then the
    train-router options of the same reading as flags, each with its source."""
    from elastic_bench.evaluation.presets import describe, get_preset
    from elastic_bench.method.commands import COMMANDS as METHOD_COMMANDS

    preset = get_preset(name)
    flags = next(c for c in METHOD_COMMANDS if c.name == "train-router").flags
    print(textwrap.fill(f"{name}: {preset.summary}.", _width()))
    for target, option, value, source in describe(preset):
        flag = flags.get(option, "--" + option.replace("_", "-"))
        shown = (f"-O {target}.{option}={_yaml_scalar(value)}" if target != "train-router" else
                 f"train-router {flag} {shlex.quote(_yaml_scalar(value))}")
        print("\n" + shown + "\n" + textwrap.fill(source, _width(), initial_indent=" " * 4, subsequent_indent=" " * 4))
    note = (f"elastic-bench run --preset {name} sets the method options (explicit -O options override them); the "
            "train-router options are not applied by run: pass them to train-router. Sources: docs/presets.md.")
    print("\n" + textwrap.fill(note, _width()))
    return 0


def _list_tasks(command: Command, args: argparse.Namespace) -> int:
    from elastic_bench import tasks
    from elastic_bench.tasks.corpora import ENV_VAR

    rows = [("TASK", "DATA", "FROM")]
    for name in tasks.names():
        sources = tasks.REGISTRY.get(name).sources
        needed = [s for s in sources if not s.when]
        if not needed:
            rows.append((name, "offline", "; ".join(["generated", *(s.where() for s in sources)])))
        else:
            hub = all(s.hub is not None or s.hub_rows is not None for s in needed)
            rows.append((name, "corpus or hub" if hub else "corpus", "; ".join(s.where() for s in sources)))
    print("\n".join(aligned(rows)))
    groups = sorted(tasks.groups().items())
    print("\n" + "\n".join(aligned([("GROUP", "TASKS"), *((g, str(len(m))) for g, m in groups)])))
    note = (f"Corpus paths are under the --data-dir DIR of elastic-bench run, else ${ENV_VAR}. A file found in neither "
            "is downloaded from the hub where one is named; else the cells of its tasks fail, naming the file.")
    print("\n" + textwrap.fill(note, _width()))
    return 0


def _lm_eval(command: Command, args: argparse.Namespace) -> int:
    try:
        from elastic_bench.evaluation.lm_eval_bridge import cli
    except ImportError as err:
        raise ValueError(f"lm-eval is not installed ({err}); pip install 'elastic-bench[lm-eval]'") from None
    return cli(args.passthrough_args)


COMMANDS = (
    Command(
        "run", "evaluate methods × tasks × lengths on a model and write results",
        "Evaluate every (method, task, length) cell on one model. Each cell writes config.json, predictions.jsonl and "
        "metrics.json under OUTPUT/<model>/<method>/<task>/<length>/; complete cells are skipped on re-run and "
        "interrupted ones resume. --config FILE.yaml sets RunConfig fields; flags override it.",
        _run, configs=("elastic_bench.evaluation.runner:RunConfig",),
        skipped=("method_options",),  # given as -O METHOD.OPTION=VALUE (and in --config files)
        arguments=_run_arguments, file_defaults=_run_file_defaults,
    ),
    Command(
        "demo", "a small fixed run on the embedded testbed model",
        "Evaluate every registered method on the testbed tasks (sparsity-sensitive and sparsity-robust needle and "
        "copy tasks) at 1K-4K tokens with the testbed model shipped in the package, on the CPU in a few minutes, "
        "render the report and print where the results are.",
        _demo, configs=(DemoConfig,),
    ),
    Command(
        "report", "tables and plots of a run folder (Markdown and self-contained HTML)",
        "Read every cell of a run folder (<model>/<method>/<task>/<length>/metrics.json, as written by `elastic-bench "
        "run` or `demo`) and write report.md with PNG plots beside it and one self-contained report.html. Method "
        "configurations of a model are compared on the cells all of them completed: per benchmark the score, ΩMSR and "
        "ΩESR per task with the benchmark's own breakdown (RULER per length, LongBench-E per length bucket, "
        "LongBench-v2 per difficulty and length, categories), the adaptive sparsity per task category, the routing "
        "map of a router, speedup vs `full`, the Pareto frontiers of score vs ΩESR and vs speedup, and "
        "paired-bootstrap score differences.",
        _report, configs=(ReportConfig,), positional=("run_dir",),
    ),
    Command(
        "compare", "the same tables and plots for several run folders side by side",
        "Read two or more run folders and write one report.md and report.html of every method configuration of every "
        "run (methods × runs) on the cells all of them completed, with per pair of configurations the score "
        "difference and its paired-bootstrap 95% interval over the shared samples (matched by task, length and sample "
        "id). Runs are named by their folders' last components.",
        _compare, configs=(CompareConfig,), positional=("runs",),
    ),
    Command("methods", "list registered methods and their options",
            "List the registered sparse-attention methods: a one-line summary of each, its options with their "
            "defaults and help; with --preset NAME, what that settings preset sets, each value with its source.",
            _list_methods, configs=(MethodsConfig,)),
    Command("tasks", "list registered tasks, the data each needs, and groups",
            "List the registered tasks, each with the data it needs (generated offline, or the corpus files it reads "
            "under --data-dir / $ELASTIC_BENCH_DATA and their hub fallback), and the groups usable in `run --tasks`.",
            _list_tasks),
    Command(
        "lm-eval", "run lm-evaluation-harness with a method applied (--model elastic)",
        "lm-evaluation-harness's own command line, with the model `elastic` registered: `elastic-bench lm-eval run "
        "--model elastic --model_args pretrained=M,method=NAME,method_<knob>=V --tasks T` (tp=N in --model_args "
        "shards the model under torchrun, as run --tp). Scores follow lm-eval's protocol, not the official one of "
        "`elastic-bench run`. Needs the lm-eval extra.",
        _lm_eval, passthrough=True,
    ),
)
