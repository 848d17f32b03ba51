"""Rendering: `ModelReport`s → ``report.md`` and ``report.html`` (plots as inline SVG, no plotting library), plus one
``<model>__<axis>.svg`` per frontier for the Markdown report to link."""

from __future__ import annotations

import datetime as _dt
import html
import math
import re
from pathlib import Path

from .collect import CellResult
from .summary import AXES, BASELINE, ModelReport


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def _tables(report: ModelReport) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of the model's tables."""
    on_front = {f.axis: set(f.methods) for f in report.frontiers}
    head = ["method", "mean score", *report.tasks, "ΩMSR", "ΩESR", "prefill s (median)", "backend", "device"]
    if any(s.speedup is not None for s in report.methods):
        head.append(f"× {BASELINE}")
    head.append("on frontier")
    rows = []
    for s in report.methods:
        row = [s.method, _fmt(s.score), *(_fmt(s.task_scores[t]) for t in report.tasks), _fmt(s.omega_msr, 3),
               _fmt(s.omega_esr, 3), _fmt(s.prefill_seconds, 3), ", ".join(s.backends) or "–",
               ", ".join(s.devices) or "–"]
        if s.speedup is not None:
            row.append(_fmt(s.speedup) + ("" if s.measures_kernels else " *"))
        row.append(", ".join(axis for axis, names in on_front.items() if s.method in names) or "–")
        rows.append(row)
    by_length = [[s.method, *(_fmt(s.length_scores[n]) for n in report.lengths)] for s in report.methods]
    return [("Scores (mean over the comparable lengths) and sparsity", head, rows),
            ("Mean score by length", ["method", *map(str, report.lengths)], by_length)]


def _cell_lines(cells: list[CellResult], with_error: bool) -> list[str]:
    return [f"{c.method} · {c.task} · {c.length}" + (f": {c.error or c.status}" if with_error else "") for c in cells]


def _cell_sections(report: ModelReport) -> list[tuple[str, list[str]]]:
    """(title, lines) of the excluded and the failed cells, for the sections that have any."""
    sections = (("Excluded cells (not completed by every method)", report.excluded, False),
                ("Failed cells", report.failed, True))
    return [(title, _cell_lines(cells, with_error)) for title, cells, with_error in sections if cells]


def _comparable(report: ModelReport) -> str:
    return (f"Comparable cells (completed by every method): {len(report.tasks)} task(s) × {len(report.lengths)} "
            f"length(s): {', '.join(report.tasks) or '–'} at {', '.join(map(str, report.lengths)) or '–'} tokens.")


CAVEAT = ("* timed on the CPU or on the `reference` backend: masked attention costs more than dense there, so this "
          "speedup does not measure kernel speed.")


def _caveat(report: ModelReport) -> str | None:
    """The footnote of the speedup column, when a method's prefills were not timed on a GPU kernel."""
    if any(s.speedup is not None and not s.measures_kernels for s in report.methods):
        return CAVEAT
    return None


def svg_plot(report: ModelReport, axis: str) -> str:
    """Score (y) against ``axis`` (x) for every method of ``report``; the frontier joined by a line."""
    points = [(getattr(s, axis), s.score, s.method) for s in report.methods]
    points = [p for p in points if not (math.isnan(p[0]) or math.isnan(p[1]))]
    front = next(f.methods for f in report.frontiers if f.axis == axis)
    W, H, left, right, top, bottom = 560, 360, 60, 30, 20, 50
    xs, ys = [p[0] for p in points] or [0.0], [p[1] for p in points] or [0.0]
    x0, x1 = min(0.0, min(xs)), max(xs)  # both axes are >= 0 by nature: start at 0
    x1 = x1 + 0.08 * (x1 - x0) if x1 > x0 else x0 + 1.0
    y0, y1 = min(0.0, min(ys)), max(100.0, max(ys))

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (W - left - right)

    def sy(y: float) -> float:
        return H - bottom - (y - y0) / (y1 - y0) * (H - top - bottom)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect x="{left}" y="{top}" width="{W - left - right}" height="{H - top - bottom}" fill="none" '
           'stroke="#888"/>']
    for i in range(5):
        xv, yv = x0 + i * (x1 - x0) / 4, y0 + i * (y1 - y0) / 4
        out.append(f'<text x="{sx(xv):.1f}" y="{H - bottom + 15}" text-anchor="middle">{xv:.3g}</text>')
        out.append(f'<text x="{left - 6}" y="{sy(yv) + 4:.1f}" text-anchor="end">{yv:.3g}</text>')
    out.append(f'<text x="{(left + W - right) / 2}" y="{H - 12}" text-anchor="middle">{html.escape(AXES[axis])}</text>')
    out.append(f'<text transform="translate(14 {(top + H - bottom) / 2}) rotate(-90)" text-anchor="middle">'
               'mean score</text>')
    by_name = {p[2]: p for p in points}
    line = " ".join(f"{sx(by_name[m][0]):.1f},{sy(by_name[m][1]):.1f}" for m in front if m in by_name)
    if line:
        out.append(f'<polyline points="{line}" fill="none" stroke="#d62728" stroke-width="1.5"/>')
    for x, y, name in points:
        color = "#d62728" if name in front else "#1f77b4"
        out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{color}"/>')
        right_half = sx(x) > (left + W - right) / 2  # labels grow away from the nearer edge
        anchor, dx = ("end", -6) if right_half else ("start", 6)
        out.append(f'<text x="{sx(x) + dx:.1f}" y="{sy(y) - 6:.1f}" text-anchor="{anchor}">{html.escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _svg_name(model: str, axis: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{model}__{axis}") + ".svg"


def render_markdown(reports: list[ModelReport], source: str, stamp: str) -> str:
    lines = ["# elastic-bench report", "", f"Results: `{source}` · generated {stamp}", ""]
    for r in reports:
        lines += [f"## {r.model}", ""]
        if not r.methods:
            lines += ["No complete cell.", ""]
        else:
            lines += [_comparable(r), ""]
            for title, head, rows in _tables(r):
                lines += [f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                lines += ["| " + " | ".join(row) + " |" for row in rows] + [""]
                if title.startswith("Scores") and _caveat(r):
                    lines += [_caveat(r), ""]
            for f in r.frontiers:
                lines += [f"Pareto frontier, score vs {AXES[f.axis]}: {' → '.join(f.methods) or '–'} "
                          f"([plot]({_svg_name(r.model, f.axis)}))", ""]
        for title, cell_lines in _cell_sections(r):
            lines += [f"**{title}**", ""] + [f"- {line}" for line in cell_lines] + [""]
    return "\n".join(lines)


def render_html(reports: list[ModelReport], source: str, stamp: str) -> str:
    e = html.escape
    parts = ["<!doctype html>", '<html><head><meta charset="utf-8"><title>elastic-bench report</title>',
             "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;"
             "margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,"
             "th:first-child{text-align:left}.plots{display:flex;flex-wrap:wrap;gap:1em}</style></head><body>",
             "<h1>elastic-bench report</h1>", f"<p>Results: <code>{e(source)}</code> · generated {e(stamp)}</p>"]
    for r in reports:
        parts.append(f"<h2>{e(r.model)}</h2>")
        if not r.methods:
            parts.append("<p>No complete cell.</p>")
        else:
            parts.append(f"<p>{e(_comparable(r))}</p>")
            for title, head, rows in _tables(r):
                parts.append(f"<h3>{e(title)}</h3><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
                parts += ["<tr>" + "".join(f"<td>{e(v)}</td>" for v in row) + "</tr>" for row in rows]
                parts.append("</table>")
                if title.startswith("Scores") and _caveat(r):
                    parts.append(f"<p>{e(_caveat(r))}</p>")
            parts.append('<div class="plots">')
            for f in r.frontiers:
                parts.append(f"<figure>{svg_plot(r, f.axis)}<figcaption>Pareto frontier, score vs "
                             f"{e(AXES[f.axis])}: {e(' → '.join(f.methods) or '–')}</figcaption></figure>")
            parts.append("</div>")
        for title, cell_lines in _cell_sections(r):
            parts.append(f"<h3>{e(title)}</h3><ul>" + "".join(f"<li>{e(x)}</li>" for x in cell_lines) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(reports: list[ModelReport], output: str | Path, source: str) -> list[Path]:
    """Write ``report.md``, ``report.html`` and the frontier SVGs into ``output``; returns the written paths."""
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    written = []
    for r in reports:
        for f in r.frontiers:
            path = out / _svg_name(r.model, f.axis)
            path.write_text(svg_plot(r, f.axis) + "\n")
            written.append(path)
    for name, text in (("report.md", render_markdown(reports, source, stamp)),
                       ("report.html", render_html(reports, source, stamp))):
        (out / name).write_text(text + "\n")
        written.append(out / name)
    return written
