"""The evaluation commands: ``run``, ``calibrate``, ``demo``, ``report``, ``compare``, ``methods``, ``tasks`` and
``lm-eval`` (`elastic_bench.foundation.commands` records; their heavy imports happen inside the handlers).

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
from elastic_bench.foundation.files import check_writable
from elastic_bench.foundation.options import (
    CommandLineText,
    check_at_least,
    check_folder_output,
    check_lengths,
    field_help,
)
from elastic_bench.results.protocols import get_protocol
from elastic_bench.testbed import STREAMING_LOCAL, STREAMING_SINK


@dataclass
class DemoConfig:
    """``elastic-bench demo``: every registered method but the oracle and NSA on the testbed tasks with the shipped
    testbed model.

    Attributes:
        output: run folder.
        limit: samples per task and length.
        lengths: comma-separated lengths in tokens (1K,2K,4K adds the 4K cells, nearly three times the work).
        threads: torch's CPU threads for the run (0: torch's default, one per core). One thread was measured the
            fastest for the testbed's small matrices: at 2K tokens a prompt took 0.68 CPU seconds on one thread and
            3.2 on two, whose threads wait for each other, and far longer under other work on the machine.
    """

    output: str = "runs/demo"
    limit: int = 3
    lengths: list[int] = field(default_factory=lambda: [1024, 2048])
    threads: int = 1

    def __post_init__(self):
        check_at_least("--limit", self.limit, 1)
        check_lengths("--lengths", self.lengths)
        check_at_least("--threads", self.threads, 0)
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
            the largest ΩESR whose score stays within δ of full attention (paired bootstrap, 95%), chosen on one half
            of the items and confirmed on the other.
        protocol: how benchmarks are averaged (official: each benchmark's own code and README; paper: the Elastic
            Attention paper's tables, e.g. RULER over 11 tasks, LongBench-E weighted by items).
    """

    run_dir: str
    output: str | None = None
    delta: float = 1.0  # elastic_bench.reports.free_sparsity.DELTA
    protocol: str = "official"

    def __post_init__(self):
        if self.output is not None:
            check_folder_output(self.output)
        if self.delta < 0:
            raise ValueError(f"--delta must be >= 0 score points, got {self.delta}")
        get_protocol(self.protocol)


@dataclass
class CompareConfig:
    """``elastic-bench compare``.

    Attributes:
        runs: two or more run folders (each the --output of `elastic-bench run`), side by side.
        output: folder for the comparison files (none: compare-RUN_A-RUN_B… beside RUN_A).
        protocol: how benchmarks are averaged (official: each benchmark's own code and README; paper: the Elastic
            Attention paper's tables).
    """

    runs: list[str]
    output: str | None = None
    protocol: str = "official"

    def __post_init__(self):
        get_protocol(self.protocol)
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
    from elastic_bench.modeling.loading import check_device, check_device_map

    check_device(config.device)
    check_device_map(config.device_map)
    rows = run(config)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for the run
        print(format_rows(rows, config.output))
    return 0 if all(r["status"] == "complete" for r in rows) else 1


def _calibrate(command: Command, args: argparse.Namespace) -> int:
    from elastic_bench.evaluation.calibration import held_out_table
    from elastic_bench.evaluation.runner import run
    from elastic_bench.evaluation.terminal import format_rows

    check_folder_output(args.output)  # as `run`: the checks that need no torch first
    config, budgets = command.configs_from(args, method_options=_merged_method_options(args))
    from elastic_bench.modeling.loading import check_device

    check_device(config.device)
    rows = run(config, budgets)
    if os.environ.get("RANK", "0") == "0":
        print(format_rows(rows, config.output))
        print("\n" + held_out_table(rows, config.output))
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
    """``-O METHOD.OPTION=VALUE`` items as ``{method: {option: value}}``; each value is the text after ``=`` as it is
    (`CommandLineText`), which the method reads by the option's declared type.

    Raises:
        ValueError: an item is not ``METHOD.OPTION=VALUE``, or one option is given two different values (a run holds
            one configuration per method: a sweep is one ``run`` per value into the same folder).
    """
    options: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        method, dot, option = key.partition(".")
        if not sep or not dot or not option:
            raise ValueError(f"method options look like METHOD.OPTION=VALUE (e.g. streaming.local=256); got {item!r}")
        value = CommandLineText(raw)
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

SWEEP_RUN = Path(__file__).resolve().parents[2] / "docs" / "testbed" / "sweep_run"
"""The run folder of the testbed's router target sweep (one H200, docs/testbed.md), which a checkout holds and a
wheel does not: the demo renders its report where it is present."""


def _demo(command: Command, args: argparse.Namespace) -> int:
    (demo,) = command.configs_from(args)  # checked before the imports below, which take seconds
    import torch

    from elastic_bench.evaluation.runner import RunConfig, run
    from elastic_bench.evaluation.terminal import format_rows
    from elastic_bench.modeling.interface import method_names
    from elastic_bench.reports import load_cells, summarize, write_report

    if demo.threads:
        torch.set_num_threads(demo.threads)
    # The testbed ships the gates train-duo and train-prulong made for it (duo_attention / prulong find them) and its
    # router (elastic). The router was trained on the testbed's four task generators, the only tasks the testbed model
    # knows: the demo scores it on them in-distribution, and its cells say so (docs/testbed.md, "The demo's cells").
    # The oracle is the reference of a budget (`calibrate`), no method to deploy. The top-k block methods at the
    # testbed's scale (its prompts are shorter than InfLLM-V2's dense_len), in blocks of 128 and 256 tokens, which the
    # CPU path computes faster; NSA is left out for time.
    config = RunConfig(
        model="testbed", methods=[m for m in method_names() if m not in ("oracle", "nsa")],
        method_options={"streaming": {"sink": STREAMING_SINK, "local": STREAMING_LOCAL},
                        "infllm_v2": {"dense_len": 0, "block_size": 128, "topk": 4, "window_size": STREAMING_LOCAL},
                        "moba": {"chunk_size": 512, "topk": 2, "block_size": 256}}, tasks=["testbed"],
        lengths=demo.lengths, limit=demo.limit, output=demo.output, allow_in_distribution=True,
    )
    rows = run(config)
    print(format_rows(rows, config.output))
    report = Path(config.output) / "report"
    cells = load_cells(config.output, scorings=official_scoring)
    write_report(summarize(cells), report, source=str(config.output))
    print(f"demo results written to {config.output}; report: {report / 'report.html'} and {report / 'report.md'}")
    _sweep_report(Path(config.output) / "sweep_report")
    return 0 if all(r["status"] == "complete" for r in rows) else 1


def _sweep_report(sweep: Path) -> None:
    """The report of the router target sweep that chose the shipped router (H200, 50 samples per cell;
    docs/testbed.md), precomputed, into ``sweep``: its frontier places a router per target among the static baselines.
    One line saying it is skipped where `SWEEP_RUN` is absent (a wheel install)."""
    from elastic_bench.reports import load_cells, summarize, write_report

    if not SWEEP_RUN.is_dir():
        print("router target sweep (precomputed): skipped (its run folder, docs/testbed/sweep_run, ships with a "
              "checkout, not with an installed wheel)")
        return
    write_report(summarize(load_cells(SWEEP_RUN, scorings=official_scoring)), sweep,
                 source="the testbed's router target sweep (docs/testbed/sweep_run, one H200)")
    print(f"router target sweep (precomputed): {sweep / 'report.html'} and {sweep / 'report.md'}")


def official_scoring(task: str):
    """The registered task ``task``, whose official scorer and aggregation the reports compute a complete cell's
    scores with (`elastic_bench.reports.load_cells`); None for a task no longer registered."""
    from elastic_bench import tasks

    return tasks.get(task) if task in tasks.names() else None


def _report(command: Command, args: argparse.Namespace) -> int:
    from elastic_bench.reports import load_cells, summarize

    (config,) = command.configs_from(args)
    output = Path(config.output) if config.output else Path(config.run_dir) / "report"
    check_folder_output(output, "--output" if config.output else "the report folder")
    check_writable(output / "report.md")
    cells = load_cells(config.run_dir, scorings=official_scoring)
    written = _write_report(summarize(cells, get_protocol(config.protocol)), output, config.run_dir,
                            "elastic-bench report", delta=config.delta)
    print(f"report written to {output / 'report.html'} and {output / 'report.md'} ({len(written)} files)")
    return 0


def _compare(command: Command, args: argparse.Namespace) -> int:
    (config,) = command.configs_from(args)  # checked before the reports' imports, which take seconds
    from elastic_bench.reports import compare, load_cells, run_names

    names = run_names(config.runs)
    output = Path(config.output) if config.output else Path(config.runs[0]).parent / "-".join(["compare", *names])
    check_folder_output(output, "--output" if config.output else "the comparison folder")
    check_writable(output / "report.md")
    cells = [c for run, name in zip(config.runs, names)
             for c in load_cells(run, run=name, scorings=official_scoring)]
    written = _write_report(compare(cells, get_protocol(config.protocol)), output, ", ".join(config.runs),
                            "elastic-bench compare")
    print(f"comparison written to {output / 'report.html'} and {output / 'report.md'} ({len(written)} files)")
    return 0


def _write_report(comparisons, output: Path, source: str, command: str, **options: Any) -> set[Path]:
    """`elastic_bench.reports.write_report` into ``output`` holding its lock (one report writer at a time), the
    temporary files of a report killed there before removed first; the distinct files written."""
    from elastic_bench.foundation.files import exclusive, stray_temporaries
    from elastic_bench.reports import write_report

    with exclusive(output, command):
        for stray in stray_temporaries(output):
            stray.unlink(missing_ok=True)
        return set(write_report(comparisons, output, source=source, **options))


# ---- listings, lm-eval -------------------------------------------------------------------------------------------


def plain(text: str) -> str:
    """``text`` without the reStructuredText markup of docstrings: ````code```` and ```name``` lose their
    backticks, the content stays."""
    return re.sub(r"``(.+?)``|`([^`]+)`", lambda m: m.group(1) or m.group(2), text)


def _summary(doc: str | None) -> str:
    """The first sentence of a docstring, as plain text on one line."""
    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    return plain(re.split(r"(?<=\.)\s+(?=[A-Z])", paragraph, maxsplit=1)[0])


def _option_text(value: Any) -> str:
    """``value`` spelt as ``-O METHOD.OPTION=VALUE`` reads it (None as ``null``, a bool as ``true``/``false``; a
    mapping as ``NAME=VALUE,...``, as a ``dict`` option reads it)."""
    if isinstance(value, dict):
        return ",".join(f"{k}={_option_text(v)}" for k, v in value.items())
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
    knobs = {name: [(f.name, _option_text(f.default), plain(field_help(cls).get(f.name, "")))
                    for f in dataclasses.fields(cls)] for name, cls in classes.items()}
    knob_widths = [max((len(row[i]) for rows in knobs.values() for row in rows), default=0) for i in range(2)]
    method_width = [max(map(len, classes))]
    for name, cls in classes.items():
        print("\n".join(aligned([(name, _summary(cls.__doc__))], widths=method_width)))
        if knobs[name]:
            print("\n".join(aligned(knobs[name], indent=4, widths=knob_widths)))
    note = ("Set an option with elastic-bench run -O METHOD.OPTION=VALUE (e.g. -O streaming.local=256); a value is "
            "read as its option's type, as a flag's is (256 or 2K, 0.5, true or false, none, text as written). Every "
            "method plans a model's full softmax-attention layers (MLA's included): a sliding-window layer keeps the "
            "model's own window and a linear-attention layer has no attention to plan (a cell records them as "
            "layer_kinds and routed_layers; docs/architectures.md).")
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
        shown = (f"-O {target}.{option}={_option_text(value)}" if target != "train-router" else
                 f"train-router {flag} {shlex.quote(_option_text(value))}")
        print("\n" + shown + "\n" + textwrap.fill(source, _width(), initial_indent=" " * 4, subsequent_indent=" " * 4))
    note = (f"elastic-bench run --preset {name} sets the method options (explicit -O options override them); the "
            "train-router options are not applied by run: pass them to train-router. Sources: docs/presets.md.")
    print("\n" + textwrap.fill(note, _width()))
    return 0


def _list_tasks(command: Command, args: argparse.Namespace) -> int:
    from elastic_bench import tasks
    from elastic_bench.tasks import catalog
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
    names = tasks.names()
    rows = [("BENCHMARK", "TASKS", "DATA", "LICENCE")]
    for bench in (b for b in catalog.BENCHMARKS if b.prefix is not None):
        count = sum(catalog.benchmark_of(n) is bench for n in names)
        rows.append((bench.name, str(count), bench.upstream, bench.licence))
    print("\n" + "\n".join(aligned(rows)))
    for bench in (b for b in catalog.BENCHMARKS if b.prefix is None):
        print(textwrap.fill(f"Not registered: {bench.name} ({bench.upstream}): {bench.note}.", _width()))
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
        "calibrate", "evaluate methods at equal budgets: each knob calibrated to a requested ΩESR, then held out",
        "For every budget of --budgets, calibrate each method's sparsity knob (streaming's window, DuoAttention's and "
        "PruLong's share of streaming heads then their window, XAttention's threshold, Elastic's router margin, the "
        "oracle's budget) per length so that its mean ΩESR (--measure omega_msr: ΩMSR) on the calibration split lies "
        "within --tolerance of the budget, then evaluate it there on the held-out prompts, beside full attention on "
        "the same prompts. Per task and length the first --calibration-samples samples calibrate (every task's "
        "pooled at a length; only prefills, no generation) and the next --limit are evaluated. Cells go to "
        "OUTPUT/<model>/<method>-esr=<budget>/<task>/<length>/ and record the knob values, the measure they reach on "
        "the calibration and held-out prompts, and the split; a method whose knob cannot reach a budget, or that has "
        "no knob, has its cells failed with the reason. Takes the options of `run`.",
        _calibrate, configs=("elastic_bench.evaluation.runner:RunConfig",
                             "elastic_bench.evaluation.calibration:BudgetConfig"),
        skipped=("method_options",), arguments=_run_arguments, file_defaults=_run_file_defaults,
    ),
    Command(
        "demo", "a small fixed run on the embedded testbed model",
        "Evaluate every registered method but the oracle and NSA on the testbed tasks (sparsity-sensitive and "
        "sparsity-robust needle and copy tasks) at 1K and 2K tokens, 3 samples per cell, with the testbed model "
        "shipped in the package, on one CPU thread (a few minutes), render the report and that of the shipped router "
        "target sweep, and print where the results are. The shipped router was trained on these very tasks (the only "
        "ones the testbed model knows): its cells are scored in-distribution and marked so.",
        _demo, configs=(DemoConfig,),
    ),
    Command(
        "report", "tables and plots of a run folder (Markdown and self-contained HTML)",
        "Read every cell of a run folder (<model>/<method>/<task>/<length>/metrics.json, as written by `elastic-bench "
        "run` or `demo`) and write report.md with PNG plots beside it and one self-contained report.html. Method "
        "configurations of a model are compared on the cells all of them completed: per benchmark the score, ΩMSR and "
        "ΩESR per task with the benchmark's own breakdown (RULER per length, LongBench-E per length bucket, "
        "LongBench-v2 per difficulty and length, categories), the adaptive sparsity per task category, the routing "
        "map of a router, speedup vs `full`, the Pareto frontiers of score vs ΩESR and vs speedup, the published "
        "figures a configuration reproduces or is compared with, the sparsest configuration within δ of full "
        "attention (chosen on half the items, confirmed on the other half), and paired-bootstrap score differences "
        "(Holm-adjusted). --protocol picks how benchmarks are averaged; every table names it.",
        _report, configs=(ReportConfig,), positional=("run_dir",),
    ),
    Command(
        "compare", "the same tables and plots for several run folders side by side",
        "Read two or more run folders and write one report.md and report.html of every method configuration of every "
        "run (methods × runs) on the cells all of them completed, with per pair of configurations the score "
        "difference and its paired-bootstrap 95% interval over the shared samples (matched by task, length and sample "
        "id), with p-values Holm-adjusted over all the pairs. Runs are named by their folders' last components; "
        "--protocol picks how benchmarks are averaged.",
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
