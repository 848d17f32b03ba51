"""Rendering: `Comparison`s → ``report.md`` (tables through tabulate, PNG plots beside it) and ``report.html`` (one
self-contained page: jinja2, plots embedded as ``data:`` URIs, sortable tables, no request to the network).

Design decisions:
- Both files show the same tables in the same order, grouped under the same headings: summary and frontiers,
  adaptive sparsity and routing, the published figures a configuration reproduces or is compared with, the sparsity
  within δ of full attention, the comparison at equal budgets and the prefill taken apart (`budgets`), one group
  per benchmark, paired differences, configurations (the legend of labels), then the excluded,
  outside-the-protocol, in-distribution and failed cells, failures folded once per distinct error message.
- Each comparison states its protocol once in full (`Protocol.describe`), each benchmark group its benchmark's
  declaration, and every table's title names the protocol it shows. A value computed from an in-distribution cell
  carries its mark in both files; the HTML page prints the values of cells scored under ``--allow-in-distribution``
  in red.
- Provenance (versions, git hashes with their ``-dirty`` mark, source digests, devices, backends, dates) is read
  from the cells' ``metrics.json``.
- Where the prefill times do not measure attention (`summary.timing_note`), the speedup frontier's place holds the
  sentence that says why, in both files.
- Every file is written atomically (`elastic_bench.foundation.files`).
"""

from __future__ import annotations

import base64
import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import pandas as pd

from elastic_bench.foundation.files import atomic_path, write_text

from . import budgets, plots, tables
from .collect import CellResult
from .free_sparsity import DELTA, free_sparsity
from .labels import folder_label, ran_with
from .page import TEMPLATE, WIDE_PIXELS
from .published import load_published, matches
from .summary import ALLOWED, Comparison
from .tables import Table, escape, slug


@dataclass
class Group:
    """Tables, plots and notes (sentences shown after the plots) under one heading."""

    id: str
    heading: str
    tables: list[Table] = field(default_factory=list)
    plots: list[plots.Plot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def section_ids(comparisons: list[Comparison]) -> list[str]:
    """The id of each comparison's section, which its groups' ids and plot files start with: its title's `slug`, with
    ``-2``, ``-3``, ... where an earlier title slugs alike (``Model.A`` and ``model-a``)."""
    ids: list[str] = []
    for comparison in comparisons:
        base = candidate = slug(comparison.title)
        count = 1
        while candidate in ids:
            count += 1
            candidate = f"{base}-{count}"
        ids.append(candidate)
    return ids


def groups(comparison: Comparison, delta: float = DELTA, base: str | None = None) -> list[Group]:
    """The headings of one comparison, with their tables and plots, in the order both files show them (``delta``: the
    δ in score points of the sparsity-for-free table; ``base``: the section's id, default its title's slug)."""
    if not comparison.configs:
        return []
    base = base or slug(comparison.title)
    if not comparison.keys:  # no cell that every configuration completed: only the legend
        return [Group(f"{base}-configurations", "Configurations", [legend(comparison)])]
    summary = Group(f"{base}-summary", "Summary and Pareto frontiers", [tables.overview(comparison)],
                    [plots.frontier(comparison, f.axis, base) for f in comparison.frontiers],
                    [comparison.speedup_note] if comparison.speedup_note else [])
    if (by_runs := tables.methods_by_runs(comparison)) is not None:
        summary.tables.append(by_runs)
    routers = [c for c in comparison.configs if c.routes_per_prompt]
    adaptive = Group(f"{base}-adaptive", "Adaptive sparsity and routing", [tables.adaptive_sparsity(comparison)],
                     [plots.sparsity_by_category(comparison, base), plots.sparsity_by_task(comparison, base),
                      *(plots.routing_map(comparison, c, base, i) for i, c in enumerate(routers))])
    found = [summary, adaptive]
    if reproduced := matches(comparison):
        found.append(Group(f"{base}-reproduction", "Published figures: reproductions and comparisons",
                           [tables.reproduction(reproduced, load_published().paper)]))
    if free := free_sparsity(comparison, delta):
        found.append(Group(f"{base}-free-sparsity", "Sparsity within δ of full attention",
                           [tables.free_sparsity_table(free, comparison.protocol.name)]))
    found += [Group(f"{base}-{slug(s.heading)}", s.heading, s.tables, s.plots, s.notes)
              for s in budgets.sections(comparison, base)]
    for name, benchmark_tables in tables.benchmark_tables(comparison):
        curve = plots.length_curves(comparison, name, base)
        declared = comparison.protocol.benchmark(name).describe()
        found.append(Group(f"{base}-{slug(name)}", name, benchmark_tables, [curve] if curve else [],
                           [f"Protocol `{comparison.protocol.name}`: {declared}."]))
    if len(comparison.configs) > 1:
        found.append(Group(f"{base}-pairs", "Paired differences", [tables.pair_differences(comparison)]))
    found.append(Group(f"{base}-configurations", "Configurations", [legend(comparison)]))
    return found


def legend(comparison: Comparison) -> Table:
    """`tables.legend`, with the options each configuration left unset as it ran with them (`labels.ran_with`: an
    elastic router's mode and streaming geometry) where any cell records them."""
    table = tables.legend(comparison)
    shown = {c.label: ran_with(c.cells.values()) for c in comparison.configs}
    if set(shown.values()) != {"–"}:
        column = table.frame.columns.get_loc("unset") + 1
        table.frame.insert(column, "unset, as run", [shown[label] for label in table.frame.index])
    return table


def _where(cell: CellResult) -> str:
    return " · ".join([*([cell.run] if cell.run else []), cell.model, folder_label(cell.method), cell.task,
                       str(cell.length)])


def _config_name(cell: CellResult) -> str:
    return " · ".join([*([cell.run] if cell.run else []), cell.model, folder_label(cell.method)])


def cell_folds(comparison: Comparison) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """(title, [(message, cells)]) for the excluded cells and the cells outside the protocol (folded by
    configuration), the in-distribution cells (folded by configuration, learned file and the identities it shares
    with the task) and the failed cells (folded by error message), for the kinds that have any."""
    found = []
    if comparison.excluded:
        by_config: dict[str, list[str]] = {}
        for c in comparison.excluded:
            by_config.setdefault(_config_name(c), []).append(f"{c.task} · {c.length}")
        found.append(("Excluded cells (complete, but not completed by every configuration)",
                      [(f"{name}: not run or not complete elsewhere", cells) for name, cells in by_config.items()]))
    if comparison.outside:
        by_config = {}
        for c in comparison.outside:
            by_config.setdefault(_config_name(c), []).append(f"{c.task} · {c.length}")
        found.append((f"Cells outside the `{comparison.protocol.name}` protocol (their tasks are not in its task set)",
                      [(f"{name}: not averaged", cells) for name, cells in by_config.items()]))
    if marked := [c for config in comparison.configs for c in config.cells.values() if c.in_distribution]:
        by_file: dict[str, list[str]] = {}
        for c in marked:
            for f in c.in_distribution:
                message = (f"{_config_name(c)}: {f['artifact']} was trained on {', '.join(f['shared'])}"
                           + (" (scored under --allow-in-distribution)" if c.allow_in_distribution else ""))
                by_file.setdefault(message, []).append(f"{c.task} · {c.length}")
        found.append(("In-distribution cells (a learned file was trained on the task's generator or dataset)",
                      list(by_file.items())))
    if comparison.failed:
        by_error: dict[str, list[str]] = {}
        for c in comparison.failed:
            by_error.setdefault(c.error or c.status, []).append(_where(c))
        found.append(("Failed cells", list(by_error.items())))
    return found


def comparable(comparison: Comparison) -> str:
    """One sentence: the cells every configuration completed, and the samples behind each of their scores."""
    tasks, lengths = comparison.tasks, comparison.lengths
    each = tables.per_cell([cell.num_samples for c in comparison.configs for cell in c.cells.values()])
    return (f"Comparable cells (completed by every configuration): {len(tasks)} task(s) × {len(lengths)} length(s): "
            f"{', '.join(tasks) or '–'} at {', '.join(map(str, lengths)) or '–'} tokens; every score below is a mean "
            f"over {each} samples per cell.")


def short_hash(git_hash: str) -> str:
    """A commit as the report shows it: 12 hex digits, and ``-dirty`` where the checkout had local changes."""
    commit = git_hash.removesuffix("-dirty")
    return commit[:12] + git_hash[len(commit):]


def provenance(comparisons: list[Comparison]) -> Table:
    """Where the results come from: every distinct version, git hash, source digest, device, backend, and the dates,
    of the cells."""
    cells = [c for comparison in comparisons for c in [*comparison.cells, *comparison.excluded, *comparison.outside]]
    rows: dict[str, str] = {}
    for key in sorted({k for c in cells for k in c.versions}):
        rows[key] = ", ".join(sorted({c.versions[key] for c in cells if key in c.versions}))
    for name, values in (("git hash", {short_hash(c.git_hash) for c in cells}),
                         ("source digest", {c.source_digest for c in cells}), ("device", {c.device for c in cells}),
                         ("backend", {c.backend for c in cells}), ("run", {c.run for c in cells})):
        if values - {""}:
            rows[name] = ", ".join(sorted(values - {""}))
    dates = sorted(c.date for c in cells if c.date)
    if dates:
        rows["dates"] = dates[0] if dates[0] == dates[-1] else f"{dates[0]} – {dates[-1]}"
    frame = pd.DataFrame({"value": rows}).rename_axis("field")
    return Table("provenance", "Provenance", frame, kind="text")


Built = list[tuple[Comparison, list[Group]]]  # each comparison with its `groups`


def render_markdown(built: Built, source: str, stamp: str) -> str:
    """``report.md``: the tables (tabulate) and links to the PNG plots written beside it; every text that comes from
    the results (names, fields, error messages) escaped (`tables.escape`), as the HTML page escapes it."""
    lines = ["# elastic-bench report", "", f"Results: `{escape(source)}` · generated {stamp}", "", "## Provenance", "",
             provenance([c for c, _ in built]).markdown(), ""]
    for comparison, found in built:
        lines += [f"## {escape(comparison.title)}", ""]
        lines += [escape(comparable(comparison)) if comparison.keys else "No cell that every configuration completed.",
                  "", escape(comparison.protocol.describe()), ""]
        for group in found:
            lines += [f"### {escape(group.heading)}", ""]
            for table in group.tables:
                lines += [f"**{escape(table.title)}**" + (f" · protocol: {escape(table.protocol)}"
                                                          if table.protocol else ""), "", table.markdown(), ""]
                lines += [escape(table.note), ""] if table.note else []
            for plot in group.plots:
                lines += [f"![{escape(plot.title)}]({plot.id}.png)", "", escape(plot.caption), ""]
            for note in group.notes:
                lines += [escape(note), ""]
        for title, folds in cell_folds(comparison):
            lines += [f"**{escape(title)}**", ""]
            lines += [f"- {escape(message)}: {escape(', '.join(cells))}" for message, cells in folds] + [""]
    return "\n".join(lines)


def _html_table(table: Table) -> dict:
    """The header and the rows of a table for the template, each cell with whether it is text (aligned left) and
    whether it is red (a value of a cell scored under ``--allow-in-distribution``)."""
    shown = table.formatted()
    text = [True] + [table.kinds.get(c, table.kind) == "text" for c in shown.columns]
    rows = []
    for name, *values in shown.itertuples():
        red = [False] + [table.mark(name, column) == ALLOWED for column in shown.columns]
        rows.append(list(zip([str(name), *values], text, red)))
    return {"header": list(zip([shown.index.name or "", *map(str, shown.columns)], text)), "rows": rows}


def render_html(built: Built, source: str, stamp: str) -> str:
    """``report.html``: one page holding everything (see `page.TEMPLATE`)."""
    sections = []
    for (comparison, found), section in zip(built, section_ids([c for c, _ in built])):
        sections.append({
            "id": section, "title": comparison.title,
            "comparable": comparable(comparison) if comparison.keys else "No cell that every configuration completed.",
            "protocol": comparison.protocol.describe(),
            "groups": [{"id": g.id, "heading": g.heading, "notes": g.notes,
                        "tables": [{"id": t.id, "title": t.title, "protocol": t.protocol, "note": t.note,
                                    **_html_table(t)}
                                   for t in g.tables],
                        "plots": [{"id": p.id, "title": p.title, "caption": p.caption, "width": p.size[0],
                                   "height": p.size[1], "wide": p.size[0] > WIDE_PIXELS,
                                   "data": base64.b64encode(p.png).decode("ascii")} for p in g.plots]}
                       for g in found],
            "cells": cell_folds(comparison),
        })
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return env.from_string(TEMPLATE).render(source=source, stamp=stamp, sections=sections,
                                            provenance=_html_table(provenance([c for c, _ in built])))


def write_report(comparisons: list[Comparison], output: str | Path, source: str, delta: float = DELTA) -> list[Path]:
    """Write ``report.md``, its PNG plots and ``report.html`` into ``output``; returns the written paths.

    Args:
        comparisons: from `summarize` (one run) or `compare` (several).
        output: the report folder (created if missing).
        source: what the results are, for the page's header (a run folder, or several).
        delta: δ in score points of the sparsity-for-free table (`free_sparsity`).
    """
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    built = [(comparison, groups(comparison, delta, base))
             for comparison, base in zip(comparisons, section_ids(comparisons))]
    written = []
    for _, found in built:
        for group in found:
            for plot in group.plots:
                with atomic_path(out / f"{plot.id}.png") as tmp:
                    tmp.write_bytes(plot.png)
                written.append(out / f"{plot.id}.png")
    for name, text in (("report.md", render_markdown(built, source, stamp)),
                       ("report.html", render_html(built, source, stamp))):
        write_text(out / name, text + "\n")
        written.append(out / name)
    return written
