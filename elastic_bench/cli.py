"""The ``elastic-bench`` command line: every command, in this one module.

Each command's options come from its config dataclass (`elastic_bench.foundation.options`: name, type and default from
the
field, help from the class docstring); the handlers import the pillars' entry points, heavy imports happen inside them
so that ``--help`` is instant. Errors a user can cause (unknown names, bad values, missing files) end with one line on
stderr and exit status 2, never a traceback; any other exception is a bug, reported in one line with exit status 1.
``elastic-bench --debug COMMAND ...`` re-raises both, with the full traceback. What can be checked without a model
(option values and ranges, devices, output paths, method knobs) is checked before any model loads.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_bench.foundation.options import add_options, command_line, field_help, from_args


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _method_options(items: list[str]) -> dict[str, dict[str, Any]]:
    """``-O METHOD.OPTION=VALUE`` items as ``{method: {option: value}}`` (values read as YAML scalars)."""
    import yaml

    options: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        method, dot, option = key.partition(".")
        if not sep or not dot or not option:
            raise ValueError(f"method options look like METHOD.OPTION=VALUE (e.g. streaming.local=256); got {item!r}")
        try:
            options.setdefault(method, {})[option] = yaml.safe_load(raw)
        except yaml.YAMLError:
            options.setdefault(method, {})[option] = raw
    return options


# ---- checks shared by the commands ------------------------------------------------------------------------------


def _file_above(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` when it is a file (nothing can be created under it), else None."""
    for existing in path.parents:
        if existing.exists():
            return None if existing.is_dir() else existing
    return None


def _folder_output(path: str | Path, flag: str = "--output") -> None:
    """Refuse an output folder that is an existing file, or lies inside one (before any work starts)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path} is a file; expected a folder")
    if blocked := _file_above(path):
        raise ValueError(f"{flag} {path} lies inside {blocked}, which is a file; expected a folder")


def _file_output(path: str | Path, flag: str = "--output") -> None:
    """Refuse an output file that is an existing folder, or lies inside a file (before any work starts)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a folder; expected a file name")
    if blocked := _file_above(path):
        raise ValueError(f"{flag} {path} lies inside {blocked}, which is a file")


def _check_device(device: str | None) -> None:
    """Refuse a ``--device`` this machine does not have (`elastic_bench.modeling.loading.check_device`), before a model
    loads."""
    if device is not None:
        from elastic_bench.modeling.loading import check_device

        check_device(device)


def _at_least(flag: str, value: int | float | None, minimum: int) -> None:
    if value is not None and value < minimum:
        raise ValueError(f"{flag} must be >= {minimum}, got {value}")


def _lengths(flag: str, lengths: list[int]) -> None:
    if not lengths or any(length < 1 for length in lengths):
        raise ValueError(f"{flag} must be positive token counts, got {','.join(map(str, lengths)) or 'none'}")


# ---- configs of the commands that have no pillar config ---------------------------------------------------------


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
        _at_least("--limit", self.limit, 1)
        _lengths("--lengths", self.lengths)
        _folder_output(self.output)


@dataclass
class ReportConfig:
    """``elastic-bench report``.

    Attributes:
        run_dir: the run folder (the --output of `elastic-bench run`).
        output: folder for the report files (none: RUN_DIR/report).
    """

    run_dir: str
    output: str | None = None


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
            _folder_output(self.output)


@dataclass(kw_only=True)
class TrainRun:
    """How a training command runs (what is learned depends on its TrainConfig alone).

    Attributes:
        max_minutes: stop after this many minutes of training, after a checkpoint; the same command resumes.
        progress: show a progress bar.
    """

    max_minutes: float | None = None
    progress: bool = True

    def __post_init__(self):
        _at_least("--max-minutes", self.max_minutes, 0)


@dataclass(kw_only=True)
class TestbedTrainRun(TrainRun):
    """How ``elastic-bench testbed train`` runs (the weights depend on the testbed `TrainConfig` alone).

    Attributes:
        output: folder for checkpoints, the log and the exported model.
        device: cuda or cpu (none: cuda when available).
    """

    output: str
    device: str | None = None

    def __post_init__(self):
        super().__post_init__()
        _folder_output(self.output)
        _check_device(self.device)


@dataclass
class TestbedDataConfig:
    """``elastic-bench testbed data``.

    Attributes:
        output: JSONL file to write.
        samples: records per task and length.
        lengths: comma-separated lengths in tokens.
        seed: record seed (the evaluation prompts use 42).
    """

    output: str
    samples: int = 64
    lengths: list[int] = field(default_factory=lambda: [1024, 2048, 4096])
    seed: int = 1

    def __post_init__(self):
        _at_least("--samples", self.samples, 1)
        _lengths("--lengths", self.lengths)
        _at_least("--seed", self.seed, 0)
        _file_output(self.output)


@dataclass
class TestbedEvalConfig:
    """``elastic-bench testbed eval``.

    Attributes:
        model: testbed, or a folder written by `testbed train`.
        samples: samples per task and length.
        lengths: comma-separated lengths in tokens.
        sink: streaming sink tokens.
        local: streaming window tokens.
        output: also write the results to this JSON file.
        device: cuda or cpu (none: cuda when available).
    """

    model: str = "testbed"
    samples: int = 100
    lengths: list[int] = field(default_factory=lambda: [1024, 2048, 4096])
    sink: int = 16
    local: int = 256
    output: str | None = None
    device: str | None = None

    def __post_init__(self):
        _at_least("--samples", self.samples, 1)
        _lengths("--lengths", self.lengths)
        _at_least("--sink", self.sink, 0)
        _at_least("--local", self.local, 1)
        if self.output is not None:
            _file_output(self.output)
        _check_device(self.device)


@dataclass
class TestbedHeadsConfig:
    """``elastic-bench testbed heads``.

    Attributes:
        output: TSV file to write.
        model: testbed, or a folder written by `testbed train`.
        length: prompt length in tokens.
        samples: samples per head and task.
        tasks: comma-separated testbed tasks whose drop makes the gate (default: the sensitive ones).
        device: cuda or cpu (none: cuda when available).
    """

    output: str
    model: str = "testbed"
    length: int = 2048
    samples: int = 20
    tasks: list[str] = field(default_factory=lambda: ["niah_single", "niah_multikey"])
    device: str | None = None

    def __post_init__(self):
        _at_least("--length", self.length, 1)
        _at_least("--samples", self.samples, 1)
        _file_output(self.output)
        _check_device(self.device)


@dataclass
class TestbedProbeConfig:
    """``elastic-bench testbed probe``.

    Attributes:
        model: testbed, or a folder written by `testbed train`.
        length: prompt length in tokens.
        samples: prompts.
        device: cuda or cpu (none: cuda when available).
    """

    model: str = "testbed"
    length: int = 1024
    samples: int = 16
    device: str | None = None

    def __post_init__(self):
        _at_least("--length", self.length, 1)
        _at_least("--samples", self.samples, 1)
        _check_device(self.device)


ROUTER_FLAGS = {"targets": "--target", "local": "--local-window"}  # train-router: the flags of the recorded recipes


# ---- handlers --------------------------------------------------------------------------------------------------


def _run(args) -> int:
    from elastic_bench.evaluation.runner import RunConfig, format_rows, run

    config = from_args(RunConfig, args, method_options=_merged_method_options(args))
    _check_device(config.device)
    _folder_output(config.output)
    rows = run(config)
    print(format_rows(rows))
    print(f"results: {config.output} (tables and frontiers: elastic-bench report {config.output})")
    return 0 if all(r["status"] == "complete" for r in rows) else 1


def _merged_method_options(args) -> dict[str, dict[str, Any]]:
    merged = {name: dict(values) for name, values in args.method_options.items()}  # from --config
    for name, values in _method_options(args.method_option).items():
        merged.setdefault(name, {}).update(values)
    return merged


def _list_methods(args) -> int:
    import dataclasses

    from elastic_bench.modeling.interface import REGISTRY, method_names

    for name in method_names():
        cls = REGISTRY.get(name)
        doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        print(f"{name:16s} {doc}")
        help_of = field_help(cls)
        for f in dataclasses.fields(cls):
            print(f"{'':18s}{f.name}={f.default!r}: {help_of.get(f.name, '')}")
    return 0


def _list_tasks(args) -> int:
    from elastic_bench import tasks

    for name in tasks.names():
        print(name)
    for group, members in sorted(tasks.groups().items()):
        print(f"group {group}: {len(members)} tasks")
    return 0


def _demo(args) -> int:
    from elastic_bench.evaluation.runner import RunConfig, format_rows, run
    from elastic_bench.modeling.interface import method_names
    from elastic_bench.modeling.loading import TESTBED_DIR
    from elastic_bench.reports import load_cells, summarize, write_report

    demo = from_args(DemoConfig, args)
    # The testbed ships its retrieval-head gates (duo_attention / prulong find them) and its router (elastic).
    config = RunConfig(
        model="testbed", methods=method_names(), method_options={"streaming": {"sink": 16, "local": 256}},
        tasks=["testbed"], lengths=demo.lengths, limit=demo.limit, output=demo.output,
    )
    rows = run(config)
    print(format_rows(rows))
    report = Path(config.output) / "report"
    write_report(summarize(load_cells(config.output)), report, source=str(config.output))
    print(f"demo results written to {config.output}; report: {report / 'report.html'} and {report / 'report.md'}")
    # The router target sweep that chose the shipped router (H200, 50 samples per cell; docs/testbed.md), precomputed:
    # its frontier places a router per target among the static baselines.
    sweep = Path(config.output) / "sweep_report"
    write_report(summarize(load_cells(TESTBED_DIR / "sweep_run")), sweep,
                 source="the testbed's router target sweep (elastic_bench/data/testbed/sweep_run, one H200)")
    print(f"router target sweep (precomputed): {sweep / 'report.html'} and {sweep / 'report.md'}")
    return 0 if all(r["status"] == "complete" for r in rows) else 1


def _report(args) -> int:
    from elastic_bench.reports import load_cells, summarize, write_report

    config = from_args(ReportConfig, args)
    output = Path(config.output) if config.output else Path(config.run_dir) / "report"
    _folder_output(output, "--output" if config.output else "the report folder")
    written = write_report(summarize(load_cells(config.run_dir)), output, source=config.run_dir)
    print(f"report written to {output / 'report.html'} and {output / 'report.md'} ({len(written)} files)")
    return 0


def _compare(args) -> int:
    from elastic_bench.reports import compare, load_cells, run_names, write_report

    config = from_args(CompareConfig, args)
    names = run_names(config.runs)
    cells = [c for run, name in zip(config.runs, names) for c in load_cells(run, run=name)]
    output = Path(config.output) if config.output else Path(config.runs[0]).parent / "-".join(["compare", *names])
    _folder_output(output, "--output" if config.output else "the comparison folder")
    written = write_report(compare(cells), output, source=", ".join(config.runs))
    print(f"comparison written to {output / 'report.html'} and {output / 'report.md'} ({len(written)} files)")
    return 0


def _bench(args, config_class: type, run_bench: Callable, format_table: Callable) -> int:
    """Run a benchmark configured by ``config_class``'s options; print its table and write its JSON (provenance and
    command added)."""
    from elastic_bench.foundation.files import write_json
    from elastic_bench.results.provenance import provenance

    config = from_args(config_class, args)
    _check_device(config.device)
    _file_output(config.output)
    report = run_bench(config)
    report = {"provenance": provenance(report["device"]), "command": _command(args), **report}
    print(format_table(report))
    write_json(config.output, report)
    print(f"results: {config.output}")
    return 0


def _bench_kernel(args) -> int:
    from elastic_bench.kernels.bench import KernelBenchConfig, format_table, run_kernel_bench

    return _bench(args, KernelBenchConfig, run_kernel_bench, format_table)


def _bench_prefill(args) -> int:
    from elastic_bench.bench.prefill import PrefillBenchConfig, format_table, run_prefill_bench

    return _bench(args, PrefillBenchConfig, run_prefill_bench, format_table)


def _bench_decode(args) -> int:
    from elastic_bench.bench.decode import DecodeBenchConfig, format_table, run_decode_bench

    return _bench(args, DecodeBenchConfig, run_decode_bench, format_table)


def _train_router(args) -> int:
    import os

    from elastic_bench.method.trainer import TrainConfig, train

    run = from_args(TrainRun, args)
    config = from_args(TrainConfig, args)
    _check_device(config.device)
    _folder_output(config.output)
    result = train(config, progress=run.progress, max_minutes=run.max_minutes)
    if os.environ.get("RANK", "0") != "0":
        return 0
    if not result.final_omega:
        print(f"router training stopped by --max-minutes: {args.output} (rerun the command to resume)")
        return 0
    omega = ", ".join(f"{c}: {v:.3f}" for c, v in result.final_omega.items())
    print(f"routers written to {args.output} (final hard ΩMSR per category: {omega})")
    return 0


def _train_gates(args) -> int:
    import os

    import numpy as np

    from elastic_bench.modeling.loading import max_positions

    module = "duo" if args.command == "train-duo" else "prulong"
    trainer = importlib.import_module(f"elastic_bench.baselines.training.{module}")
    if module == "duo":
        config_class, train = trainer.DuoTrainConfig, trainer.train_duo
    else:
        config_class, train = trainer.PruLongTrainConfig, trainer.train_prulong
    run = from_args(TrainRun, args)
    config = from_args(config_class, args)
    _check_device(config.device)
    _folder_output(config.output)
    positions = max_positions(config.model)
    if config.data.max_length > positions:
        raise ValueError(f"--max-length {config.data.max_length} exceeds the {positions} positions of "
                         f"{config.model}")
    gates, result = train(config, progress=run.progress, max_minutes=run.max_minutes)
    if os.environ.get("RANK", "0") != "0":
        return 0
    if not result.complete:
        print(f"{args.command} stopped by --max-minutes at step {result.done}: {config.output} (rerun the command "
              "to resume)")
        return 0
    top = sorted(((float(v), layer, head) for (layer, head), v in np.ndenumerate(gates)), reverse=True)[:3]
    ranked = ", ".join(f"layer {layer} KV head {head}: {v:.3f}" for v, layer, head in top)
    print(f"gates written to {config.output}/full_attention_heads.tsv (highest: {ranked}); use "
          f"-O {'duo_attention' if module == 'duo' else 'prulong'}.pattern={config.output}")
    return 0


def _testbed_train(args) -> int:
    from elastic_bench.testbed.training.train import TrainConfig, train

    run = from_args(TestbedTrainRun, args)
    config = from_args(TrainConfig, args)
    command = shlex.join(["elastic-bench", "testbed", "train", "--output", run.output,
                          *command_line(TrainConfig, config)])
    record = train(config, run.output, run.device, run.max_minutes, command, progress=run.progress)
    state = "complete" if record["complete"] else f"stopped at step {record['steps_done']} (rerun to resume)"
    print(f"testbed training {state}: {run.output}")
    if "evaluation" in record:
        print(json.dumps({k: v["families"] for k, v in record["evaluation"].items() if isinstance(v, dict)
                          and "families" in v}))
    return 0


def _testbed_data(args) -> int:
    from elastic_bench.testbed.training.records import write_records

    config = from_args(TestbedDataConfig, args)
    count = write_records(config.output, config.lengths, config.samples, config.seed)
    print(f"{count} records written to {config.output}")
    return 0


def _testbed_eval(args) -> int:
    from elastic_bench.kernels import StreamingGeometry
    from elastic_bench.modeling.loading import load_model
    from elastic_bench.testbed.training.evaluate import exact_match, family_means
    from elastic_bench.testbed.vocab import build

    config = from_args(TestbedEvalConfig, args)
    geometry = StreamingGeometry(config.sink, config.local)
    model, _ = load_model(config.model, device=config.device)
    vocab = build()
    results = {}
    for label, streaming in (("full", None), ("streaming", geometry)):
        found = exact_match(model, vocab, config.lengths, config.samples, streaming=streaming)
        results[label] = {"tasks": found, "families": family_means(found)}
        for task, per_length in found.items():
            cells = "  ".join(f"{length}: {pct:6.2f}" for length, pct in per_length.items())
            print(f"{label:9s} {task:24s} {cells}")
    if config.output:
        from elastic_bench.foundation.files import write_json

        write_json(config.output, {"model": config.model, "samples": config.samples, "sink": config.sink,
                                   "local": config.local, **results})
    return 0


def _testbed_tasks(names: list[str]) -> tuple[str, ...]:
    from elastic_bench.testbed.generators import SPECS

    tasks = tuple(t.removeprefix("testbed_") for t in names)
    unknown = [t for t in tasks if t not in SPECS]
    if unknown:
        raise ValueError(f"unknown testbed tasks {unknown}; known: {list(SPECS)}")
    return tasks


def _testbed_heads(args) -> int:
    from elastic_bench.modeling.loading import load_model
    from elastic_bench.testbed.training.heads import ablation_gates, write_gates
    from elastic_bench.testbed.vocab import build

    config = from_args(TestbedHeadsConfig, args)
    tasks = _testbed_tasks(config.tasks)
    model, _ = load_model(config.model, device=config.device)
    gates = ablation_gates(model, build(), config.length, config.samples, tasks)
    write_gates(gates, config.output)
    print(gates.round(2))
    print(f"head gates written to {config.output}")
    return 0


def _testbed_probe(args) -> int:
    import numpy as np

    from elastic_bench.modeling.loading import load_model
    from elastic_bench.testbed.training.heads import best_head, key_matching
    from elastic_bench.testbed.vocab import build

    config = from_args(TestbedProbeConfig, args)
    model, _ = load_model(config.model, device=config.device)
    selectivity = key_matching(model.float(), build(), config.length, config.samples)
    with np.printoptions(precision=2, suppress=True, linewidth=160):
        print(f"key-matching selectivity, layers x query heads ({config.samples} prompts, {config.length} tokens):")
        print(selectivity)
    best = best_head(selectivity)
    print(f"best head: layer {best['layer']}, query head {best['head']}, selectivity {best['selectivity']:.3f}")
    return 0


def _lm_eval(args) -> int:
    try:
        from elastic_bench.evaluation.lm_eval_bridge import cli
    except ImportError as err:
        raise ValueError(f"lm-eval is not installed ({err}); pip install 'elastic-bench[lm-eval]'") from None
    return cli(args.passthrough_args)


def _command(args) -> str:
    return "elastic-bench " + shlex.join(args.argv)


# ---- the parser ------------------------------------------------------------------------------------------------


# Each command's config classes, in the order their options are added: classes of this module, or "module:Class"
# for those of the pillars (imported only for the command being parsed: they import torch).
CONFIGS: dict[str, tuple[type | str, ...]] = {
    "run": ("elastic_bench.evaluation.runner:RunConfig",),
    "demo": (DemoConfig,),
    "report": (ReportConfig,),
    "compare": (CompareConfig,),
    "bench kernel": ("elastic_bench.kernels.bench:KernelBenchConfig",),
    "bench prefill": ("elastic_bench.bench.prefill:PrefillBenchConfig",),
    "bench decode": ("elastic_bench.bench.decode:DecodeBenchConfig",),
    "train-router": ("elastic_bench.method.trainer:TrainConfig", TrainRun),
    "train-duo": ("elastic_bench.baselines.training.duo:DuoTrainConfig", TrainRun),
    "train-prulong": ("elastic_bench.baselines.training.prulong:PruLongTrainConfig", TrainRun),
    "testbed train": (TestbedTrainRun, "elastic_bench.testbed.training.train:TrainConfig"),
    "testbed data": (TestbedDataConfig,),
    "testbed eval": (TestbedEvalConfig,),
    "testbed heads": (TestbedHeadsConfig,),
    "testbed probe": (TestbedProbeConfig,),
}


def config_classes(command: str) -> list[type]:
    """The config classes of ``command`` (e.g. ``"testbed train"``)."""
    found = []
    for entry in CONFIGS[command]:
        if isinstance(entry, str):
            module, _, name = entry.partition(":")
            entry = getattr(importlib.import_module(module), name)
        found.append(entry)
    return found


SKIPPED = {"run": ("method_options",)}  # given as -O METHOD.OPTION=VALUE (and in --config files)
FLAGS = {"train-router": ROUTER_FLAGS, "train-duo": {"local": "--local-window"},
         "train-prulong": {"local": "--local-window"}}  # torchrun would take --local for its --local-addr
POSITIONAL = {"report": ("run_dir",), "compare": ("runs",)}  # a list field takes one or more words

DESCRIPTIONS: dict[str, tuple[str, str, Callable[[Any], int]]] = {
    "run": ("evaluate methods × tasks × lengths on a model and write results",
            "Evaluate every (method, task, length) cell on one model. Each cell writes config.json, predictions.jsonl "
            "and metrics.json under OUTPUT/<model>/<method>/<task>/<length>/; complete cells are skipped on re-run "
            "and interrupted ones resume. --config FILE.yaml sets RunConfig fields; flags override it.", _run),
    "demo": ("a small fixed run on the embedded testbed model",
             "Evaluate every registered method on the testbed tasks (sparsity-sensitive and sparsity-robust needle "
             "and copy tasks) at 1K-4K tokens with the testbed model shipped in the package, on the CPU in a few "
             "minutes, render the report and print where the results are.", _demo),
    "report": ("tables and plots of a run folder (Markdown and self-contained HTML)",
               "Read every cell of a run folder (<model>/<method>/<task>/<length>/metrics.json, as written by "
               "`elastic-bench run` or `demo`) and write report.md with PNG plots beside it and one self-contained "
               "report.html. Method configurations of a model are compared on the cells all of them completed: "
               "per benchmark the score, ΩMSR and ΩESR per task with the benchmark's own breakdown (RULER per "
               "length, LongBench-E per length bucket, LongBench-v2 per difficulty and length, categories), the "
               "adaptive sparsity per task category, the routing map of a router, speedup vs `full`, the Pareto "
               "frontiers of score vs ΩESR and vs speedup, and paired-bootstrap score differences.", _report),
    "compare": ("the same tables and plots for several run folders side by side",
                "Read two or more run folders and write one report.md and report.html of every method "
                "configuration of every run (methods × runs) on the cells all of them completed, with per pair of "
                "configurations the score difference and its paired-bootstrap 95% interval over the shared samples "
                "(matched by task, length and sample id). Runs are named by their folders' last components.",
                _compare),
    "bench kernel": ("time hybrid-attention backends against dense SDPA and FlexAttention",
                     "Time every hybrid-attention backend available on the device, dense "
                     "scaled_dot_product_attention and the XAttention estimation. Prints a table (ms, effective "
                     "TFLOP/s on attended pairs, speedup vs dense SDPA and vs flex) and writes JSON with the versions "
                     "and the device.", _bench_kernel),
    "bench prefill": ("time a model's prefill under each method beside full attention and the no-attention floor",
                      "Time one prefill forward of random token ids (batch 1, logits_to_keep=1, no cache; bf16 on "
                      "CUDA) under the floor (attention replaced by a no-op: what no sparse method can beat), the "
                      "model's own SDPA, the full method and each of --methods: every method's untimed warm-up "
                      "forward, then --repeats rounds of one timed forward per method in turn. Prints a table "
                      "(median and mean seconds, speedup vs full, fraction of the ideal speedup "
                      "t_full / (t_floor + (t_full - t_floor)(1 - ΩESR)), ΩMSR, ΩESR, routing time, kernel backend, "
                      "peak memory) and writes JSON with the versions and the device. A method that fails is "
                      "recorded with its error.", _bench_prefill),
    "bench decode": ("time decode steps after a long prompt: full and evicting KV caches beside transformers' SDPA",
                     "Prefill random token ids once per method and length (batch 1; bf16 on CUDA), then time "
                     "--steps decode forwards (after --warmup) with each --kv-caches variant: dynamic "
                     "(transformers' cache), full (packed, every token) and evicting (streaming heads keep sink + "
                     "window); transformers' own SDPA decode is the reference row. Prints ms per token (median, "
                     "mean), the speedups, the KV bytes held against a full cache, and the bandwidth bound (weights "
                     "+ attended KV read once); with --max-memory, whether a prompt of the largest length plus "
                     "--generate tokens fits under that budget. Writes JSON with the versions and the device.",
                     _bench_decode),
    "train-router": ("train Elastic Attention routers (frozen backbone)",
                     "Train one Attention Router per layer of a frozen model, with per-category Lagrangian sparsity "
                     "targets (Elastic Attention, arXiv 2601.17367). Writes router.safetensors + router_config.json, "
                     "train_log.jsonl and a resume state to OUTPUT; re-running the same command resumes. Runs on one "
                     "device, or under `torchrun --nproc-per-node N -m elastic_bench train-router ...` with FSDP2 "
                     "over the backbone.", _train_router),
    "train-duo": ("train DuoAttention's retrieval-head gates for a model (frozen backbone)",
                  "Train one gate α per KV head (DuoAttention, arXiv 2410.10819; upstream's recipe): each head outputs "
                  "α·full + (1 − α)·streaming, distilled from the same model with full attention on the final hidden "
                  "states of synthetic multi-passkey retrieval, plus an L1 term on α. Writes "
                  "full_attention_heads.tsv (rows = layers; -O duo_attention.pattern=OUTPUT), config.json, "
                  "train_log.jsonl and a resume state to OUTPUT; re-running the same command resumes. One device, or "
                  "torchrun with FSDP2 over the backbone.", _train_gates),
    "train-prulong": ("train PruLong's hard-concrete head masks for a model (frozen backbone)",
                      "Train one hard-concrete mask per KV head (PruLong, arXiv 2506.17121; upstream's recipe): each "
                      "head outputs z·full + (1 − z)·streaming, with the LM loss plus a Lagrangian steering the head "
                      "sparsity to --target (ramped from 0), on DuoAttention's passkey data. Writes the 0/1 masks at "
                      "--target as full_attention_heads.tsv (-O prulong.pattern=OUTPUT), log_alpha.tsv, config.json, "
                      "train_log.jsonl and a resume state to OUTPUT; re-running the same command resumes.",
                      _train_gates),
    "testbed train": ("train the testbed model from scratch",
                      "Train the testbed model: word-level tokenizer, task generators, context curriculum 256 → 4096, "
                      "bf16 on the GPU; the defaults are the shipped checkpoint's recipe. Deterministic from --seed "
                      "(deterministic kernels). Writes checkpoints, a log, and at the end the model (config.json, "
                      "model.safetensors in bf16, tokenizer files) and TRAINING.json (command, versions, exact-match "
                      "accuracies with full and streaming attention). Rerunning with the same --output resumes.",
                      _testbed_train),
    "testbed data": ("write router-training records (JSONL) from the testbed tasks",
                     "Write {prompt, answer, category} records (category: sensitive or robust) from every testbed "
                     "task, for `elastic-bench train-router --model testbed`. Seeds differ from the evaluation "
                     "prompts'.", _testbed_data),
    "testbed eval": ("exact-match accuracy of a testbed model with full and streaming attention",
                     "Teacher-forced greedy exact match on every testbed task (the prompts of `elastic-bench run "
                     "--tasks testbed`), batched: with full attention, and with sink + window streaming on every head "
                     "over the prompt and dense answer positions (a streaming prefill, then dense decode, as the "
                     "harness runs it).", _testbed_eval),
    "testbed heads": ("find the retrieval heads by ablation and write DuoAttention-layout head gates",
                      "Switch each KV head alone to streaming (sink 16, window 256) and write the largest relative "
                      "drop of exact match over --tasks as its gate (TSV, layers × KV heads), usable as "
                      "-O duo_attention.pattern=FILE.", _testbed_heads),
    "testbed probe": ("does a testbed model find a needle by its key? (per-head key-matching selectivity)",
                      "At the question's key token of niah_multikey prompts, the attention mass each query head puts "
                      "on the queried needle minus its mean mass on a distractor needle (layers × query heads). A "
                      "model that retrieves by key has a head near 1; one that picks a needle by position has none.",
                      _testbed_probe),
}
GROUPS = {"bench": "micro-benchmarks that print a table and write JSON",
          "testbed": "train, evaluate and make router data for the testbed model (a 6-layer Llama trained by "
                     "elastic-bench on synthetic long-context tasks, shipped as --model testbed)"}


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (the command's name, the error, where to look), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``elastic-bench`` parser, and the parser of each command by name (``"testbed train"``, ...).

    With ``argv``, only the command it names gets its options (the config classes of the others import torch, and
    ``--help`` should be instant); without, every command does."""
    parser = _Parser(
        prog="elastic-bench",
        description="Evaluate long-context sparse-attention methods (Elastic Attention, DuoAttention, PruLong, "
        "XAttention, streaming, full) on real LLMs with official scoring and exact sparsity accounting.",
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (before the command: elastic-bench --debug run ...)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, Any] = {}
    words = [w for w in argv if not w.startswith("-")][:2] if argv is not None else None
    commands: dict[str, argparse.ArgumentParser] = {}
    for name, (help_text, description, handler) in DESCRIPTIONS.items():
        group, _, leaf = name.rpartition(" ")
        if group and group not in groups:
            groups[group] = sub.add_parser(group, help=GROUPS[group], description=GROUPS[group]).add_subparsers(
                dest="subcommand", required=True, metavar="SUBCOMMAND")
        p = (groups[group] if group else sub).add_parser(leaf, help=help_text, description=description)
        p.set_defaults(handler=handler)
        commands[name] = p
        if words is not None and words[: len(name.split())] != name.split():
            continue
        for cls in config_classes(name):
            positional = POSITIONAL.get(name, ())
            for field_name in positional:
                many = typing.get_origin(typing.get_type_hints(cls)[field_name]) is list
                p.add_argument(field_name, nargs="+" if many else None, help=field_help(cls)[field_name])
            add_options(p, cls, skip=(*SKIPPED.get(name, ()), *positional), flags=FLAGS.get(name))
    run = commands["run"]
    run.add_argument("--config", help="YAML file of RunConfig fields; flags given with it override its values")
    run.add_argument("-O", "--method-option", action="append", default=[], metavar="METHOD.OPTION=VALUE",
                     help="a method knob, e.g. -O streaming.local=256 (repeatable; see `elastic-bench methods`)")
    run.set_defaults(method_options={})
    sub.add_parser("methods", help="list registered methods and their options",
                   description="List the registered sparse-attention methods with their options and defaults."
                   ).set_defaults(handler=_list_methods)
    sub.add_parser("tasks", help="list registered tasks and groups",
                   description="List the registered tasks and the groups usable in `run --tasks`."
                   ).set_defaults(handler=_list_tasks)
    lm_eval = sub.add_parser(
        "lm-eval", help="run lm-evaluation-harness with a method applied (--model elastic)", add_help=False,
        description="lm-evaluation-harness's own command line, with the model `elastic` registered: "
        "`elastic-bench lm-eval run --model elastic --model_args pretrained=M,method=NAME,method_<knob>=V --tasks T`. "
        "Scores follow lm-eval's protocol, not the official one of `elastic-bench run`. Needs the lm-eval extra.",
    )
    lm_eval.set_defaults(handler=_lm_eval, passthrough=True)  # every argument goes to lm_eval, --help included
    return parser, commands


def _parse(argv: list[str]) -> argparse.Namespace:
    parser, commands = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "passthrough", False):
        args.passthrough_args = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    elif getattr(args, "config", None):  # the file's values become the defaults the flags override
        from elastic_bench.evaluation.runner import RunConfig

        values = RunConfig.from_yaml(args.config)
        commands["run"].set_defaults(**values)
        args = parser.parse_args(argv)
    args.argv = argv
    return args


# Exceptions a user can cause (a bad value, a missing or unreadable file, an unknown name, a missing extra): one line,
# exit status 2. UnknownNameError is a ValueError.
USER_ERRORS = (ValueError, FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
               NotImplementedError, ImportError)


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
        return args.handler(args)
    except KeyboardInterrupt:
        print("elastic-bench: interrupted; results written so far are kept", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of a listing went away (`elastic-bench methods | head`)
        sys.stderr.close()
        return 0
    except USER_ERRORS as err:
        if debug:
            raise
        print(f"elastic-bench: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except Exception as err:  # a bug: one line, unless --debug asks for the traceback
        if debug:
            raise
        print(f"elastic-bench: internal error: {type(err).__name__}: {_one_line(err)} (rerun with --debug for the "
              "traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
