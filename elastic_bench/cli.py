"""The ``elastic-bench`` command line.

Every subcommand has ``--help``; heavy imports happen inside the handlers so help is instant. Errors a user can
cause (unknown names, bad values, missing files) end with one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _lengths(value: str) -> list[int]:
    try:
        return [_tokens(v) for v in _csv(value)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"lengths must be token counts like 1024,4K,128K; got {value!r}") from None


def _tokens(value: str) -> int:
    value = value.strip().upper()
    return int(value[:-1]) * 1024 if value.endswith("K") else int(value)


def _method_options(items: list[str]) -> dict[str, dict[str, Any]]:
    import yaml

    options: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        method, dot, option = key.partition(".")
        if not sep or not dot or not option:
            raise ValueError(f"method options look like METHOD.OPTION=VALUE (e.g. streaming.local=256); got {item!r}")
        options.setdefault(method, {})[option] = yaml.safe_load(raw)
    return options


# ---- run ---------------------------------------------------------------------------------------------------------


def _add_run(sub) -> None:
    p = sub.add_parser(
        "run",
        help="evaluate methods × tasks × lengths on a model and write results",
        description="Evaluate every (method, task, length) cell on one model. Each cell writes config.json, "
        "predictions.jsonl and metrics.json under OUTPUT/<model>/<method>/<task>/<length>/; complete cells are "
        "skipped on re-run and interrupted ones resume.",
    )
    p.add_argument("--config", help="YAML file with RunConfig fields; flags below override it")
    p.add_argument("--model", help="tiny:qwen3, tiny:llama, testbed, a local path or a hub id (default tiny:qwen3)")
    p.add_argument("--methods", type=_csv, help="comma-separated method names (see `elastic-bench methods`)")
    p.add_argument(
        "-O", "--method-option", action="append", default=[], metavar="METHOD.OPTION=VALUE",
        help="a method knob, e.g. -O streaming.local=256 (repeatable)",
    )
    p.add_argument("--tasks", type=_csv, help="comma-separated task or group names (see `elastic-bench tasks`)")
    p.add_argument("--lengths", type=_lengths, help="comma-separated target lengths in tokens, e.g. 4K,8K")
    p.add_argument("--limit", type=int, help="samples per task and length")
    p.add_argument("--seed", type=int, help="sample-generation seed (default 42)")
    p.add_argument("--output", help="run folder (default runs/latest)")
    p.add_argument(
        "--data-dir", help="local directory of benchmark corpora (LongBench, RULER essays/SQuAD/HotpotQA, ...); "
        "default $ELASTIC_BENCH_DATA, then the Hugging Face hub where it holds the official files",
    )
    p.add_argument("--backend", help="kernel backend: auto (default), reference, triton, flex, ...")
    p.add_argument("--device", help="cuda, cpu, cuda:1, ... (default: cuda when available)")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], help="model dtype")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.set_defaults(handler=_run)


def _run(args) -> int:
    from elastic_bench.runner import RunConfig, format_rows, run

    overrides = {
        "model": args.model, "methods": args.methods, "tasks": args.tasks, "lengths": args.lengths,
        "limit": args.limit, "seed": args.seed, "output": args.output, "data_dir": args.data_dir,
        "backend": args.backend,
        "device": args.device, "dtype": args.dtype,
        "method_options": _method_options(args.method_option) or None,
    }
    if args.config:
        config = RunConfig.from_yaml(args.config, **overrides)
    else:
        config = RunConfig(**{k: v for k, v in overrides.items() if v is not None})
    rows = run(config, progress=not args.no_progress)
    print(format_rows(rows))
    print(f"results: {config.output} (tables and frontiers: elastic-bench report {config.output})")
    return 0 if all(r["status"] == "complete" for r in rows) else 1


# ---- listings ----------------------------------------------------------------------------------------------------


def _add_listings(sub) -> None:
    p = sub.add_parser("methods", help="list registered methods and their options",
                       description="List the registered sparse-attention methods with their options and defaults.")
    p.set_defaults(handler=_list_methods)
    p = sub.add_parser("tasks", help="list registered tasks and groups",
                       description="List the registered tasks and the groups usable in `run --tasks`.")
    p.set_defaults(handler=_list_tasks)


def _list_methods(args) -> int:
    import dataclasses

    from elastic_bench import methods

    for name in methods.names():
        cls = methods.REGISTRY.get(name)
        options = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(cls))
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        print(f"{name:16s} {doc}")
        if options:
            print(f"{'':16s}   options: {options}")
    return 0


def _list_tasks(args) -> int:
    from elastic_bench import tasks

    for name in tasks.names():
        print(name)
    for group, members in sorted(tasks.GROUPS.items()):
        print(f"group {group}: {len(members)} tasks")
    return 0


# ---- demo --------------------------------------------------------------------------------------------------------


def _add_demo(sub) -> None:
    p = sub.add_parser(
        "demo", help="a small fixed run on the embedded testbed model",
        description="Evaluate every registered method on the testbed tasks (sparsity-sensitive and sparsity-robust "
        "needle and copy tasks) at 1K-4K tokens with the testbed model shipped in the package, on the CPU in a few "
        "minutes, and print where the results are.",
    )
    p.add_argument("--output", default="runs/demo", help="run folder (default runs/demo)")
    p.add_argument("--limit", type=int, default=3, help="samples per task and length (default 3)")
    p.add_argument("--lengths", type=_lengths, default=[1024, 2048, 4096], help="lengths in tokens (default 1K,2K,4K)")
    p.set_defaults(handler=_demo)


def _demo(args) -> int:
    from elastic_bench import methods
    from elastic_bench.runner import RunConfig, format_rows, run

    # The testbed ships its retrieval-head gates (duo_attention / prulong find them) and its router (elastic).
    names = methods.names()
    config = RunConfig(
        model="testbed", methods=names, method_options={"streaming": {"sink": 16, "local": 256}},
        tasks=["testbed"], lengths=args.lengths, limit=args.limit, output=args.output,
    )
    rows = run(config)
    print(format_rows(rows))
    from elastic_bench.reports import load_cells, summarize, write_report

    report = Path(config.output) / "report"
    write_report(summarize(load_cells(config.output)), report, source=str(config.output))
    print(f"demo results written to {config.output}; report: {report / 'report.html'} and {report / 'report.md'}")
    return 0 if all(r["status"] == "complete" for r in rows) else 1


# ---- lm-eval -------------------------------------------------------------------------------------------------------


def _add_lm_eval(sub) -> None:
    p = sub.add_parser(
        "lm-eval", help="run lm-evaluation-harness with a method applied (--model elastic)", add_help=False,
        description="lm-evaluation-harness's own command line, with the model `elastic` registered: "
        "`elastic-bench lm-eval run --model elastic --model_args pretrained=M,method=NAME,method_<knob>=V --tasks T`. "
        "Scores follow lm-eval's protocol, not the official one of `elastic-bench run`. Needs the lm-eval extra.",
    )
    p.set_defaults(handler=_lm_eval, passthrough=True)  # every argument goes to lm_eval, --help included


def _lm_eval(args) -> int:
    try:
        from elastic_bench.lm_eval_bridge import cli
    except ImportError as err:
        raise ValueError(f"lm-eval is not installed ({err}); pip install 'elastic-bench[lm-eval]'") from None
    return cli(args.passthrough_args)


# ---- entry point -------------------------------------------------------------------------------------------------

COMMANDS: list[Callable[[Any], None]] = [_add_run, _add_listings, _add_demo, _add_lm_eval]
# Subcommands defined next to the code they drive, as "module:function" (the function adds its parser; the module
# must import nothing heavy at import time).
PLUGIN_COMMANDS: tuple[str, ...] = (
    "elastic_bench.testbed.cli:add_cli",
    "elastic_bench.kernels.bench:add_cli",
    "elastic_bench.method.cli:add_cli",
    "elastic_bench.reports.cli:add_cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elastic-bench",
        description="Evaluate long-context sparse-attention methods (Elastic Attention, DuoAttention, PruLong, "
        "XAttention, streaming, full) on real LLMs with official scoring and exact sparsity accounting.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    for spec in PLUGIN_COMMANDS:
        module, _, function = spec.partition(":")
        getattr(importlib.import_module(module), function)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "passthrough", False):
        args.passthrough_args = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from elastic_bench.registry import UnknownNameError

    try:
        return args.handler(args)
    except (UnknownNameError, ValueError, FileNotFoundError, NotImplementedError) as err:
        print(f"elastic-bench: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("elastic-bench: interrupted; results written so far are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
