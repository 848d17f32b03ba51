"""``elastic-bench report``: render a run folder as Markdown and HTML."""

from __future__ import annotations


def add_cli(sub) -> None:
    p = sub.add_parser(
        "report", help="tables, Pareto frontiers and plots of a run folder (Markdown and HTML)",
        description="Read every cell of a run folder (<model>/<method>/<task>/<length>/metrics.json, as written by "
        "`elastic-bench run` or `demo`) and write report.md, report.html and one SVG per frontier. Methods of a model "
        "are compared on the cells all of them completed: mean score per task and length, ΩMSR, ΩESR, prefill time, "
        "speedup vs the `full` method, and the Pareto frontiers of score vs ΩESR and score vs speedup.",
    )
    p.add_argument("run_dir", help="the run folder (the --output of `elastic-bench run`)")
    p.add_argument("--output", help="folder for the report files (default: RUN_DIR/report)")
    p.set_defaults(handler=_report)


def _report(args) -> int:
    from pathlib import Path

    from . import load_cells, summarize, write_report

    output = Path(args.output) if args.output else Path(args.run_dir) / "report"
    reports = summarize(load_cells(args.run_dir))
    written = write_report(reports, output, source=args.run_dir)
    print(f"report written to {output / 'report.html'} and {output / 'report.md'} ({len(written)} files)")
    return 0
