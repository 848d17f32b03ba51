"""The terminal table of a run: one row per cell (`summary_row`), a per-method summary above them, a legend and the
CPU caveat (`format_rows`). A cell a learned file was trained on (its ``metrics.json`` records a non-empty
``in_distribution``) is marked in a column of its own, shown only when some cell is. The report
(`elastic_bench.reports`) holds the full tables and frontiers."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elastic_bench.results.store import ALLOWED, IN_DISTRIBUTION, Cell, in_distribution_mark

UNKNOWN = "?"  # the mark of a cell whose method loaded a learned file that records no provenance

# Not columns where they stand: the device and learned files feed `format_rows`' lines, the in-distribution mark is
# a last column where any cell has one.
HIDDEN = ("device", "learned_files", "in_distribution")


def summary_row(cell: Cell) -> dict[str, Any]:
    """One line of the run summary for ``cell``; ``device`` (where it ran) and ``learned_files`` (the names of the
    learned files its method loaded, by option) are kept for `format_rows` and not shown as columns;
    ``in_distribution`` is the cell's mark (``†``, ``‡`` where the run was told to score it:
    `elastic_bench.results.store.in_distribution_mark`; ``?`` where a learned file records no provenance; "" for a
    held-out cell)."""
    metrics = cell.metrics() or {}
    marked = in_distribution_mark(metrics.get("in_distribution"), metrics.get("allow_in_distribution") is True) or (
        UNKNOWN if None in (metrics.get("artifact_provenance") or {}).values() else "")
    return {
        "model": cell.model,
        "method": cell.method,
        "task": cell.task,
        "length": cell.length,
        "status": metrics.get("status", "missing"),
        "score": metrics.get("score"),
        "n": metrics.get("num_samples"),
        "omega_msr": metrics.get("omega_msr"),
        "omega_esr": metrics.get("omega_esr"),
        "prefill_ms": 1000 * metrics["prefill_seconds"] if "prefill_seconds" in metrics else None,
        "device": metrics.get("device"),
        "in_distribution": marked,
        "learned_files": metrics.get("learned_files") or {},
    }


# Decimals per column of the terminal table: scores are 0-100, sparsities fractions.
_DECIMALS = {"score": 1, "omega_msr": 3, "omega_esr": 3, "prefill_ms": 1}
_HEADERS = {"omega_msr": "ΩMSR", "omega_esr": "ΩESR", "in_distribution": "in-dist"}
LEGEND = ("score: the task's score (0-100) over n samples; ΩMSR: share of (layer, KV head) pairs not attending in "
          "full;\nΩESR: share of causal (query, key) pairs skipped; prefill_ms: mean prefill of a cell's prompts timed "
          "alone. The summary gives\nmeans over a method's complete cells, the samples behind them, and the median of "
          "their prefill_ms.")
IN_DISTRIBUTION_LEGEND = (f"in-dist: {IN_DISTRIBUTION} a learned file of the method was trained on the task's "
                          f"generator or dataset; {ALLOWED} the same, scored because the run was given "
                          f"--allow-in-distribution; {UNKNOWN} a learned file records no provenance (what it "
                          "was trained on is unknown).")
CPU_CAVEAT = ("prefill_ms was measured on the CPU, where sparse methods do not run the GPU kernels: it says nothing of "
              "their speedups.")


def format_rows(rows: list[dict[str, Any]], output: str | Path) -> str:
    """The terminal table of a run's `summary_row` rows: a per-method summary, the per-cell table, a legend naming
    ``elastic-bench report OUTPUT`` for the full tables, and a caveat line where any prefill ran on the CPU."""
    from tabulate import tabulate

    if not rows:
        return "(no cells)"
    marked = any(r.get("in_distribution") for r in rows)
    columns = [c for c in rows[0] if c not in HIDDEN] + (["in_distribution"] if marked else [])
    table = tabulate([[_format(c, r.get(c)) for c in columns] for r in rows],
                     headers=[_HEADERS.get(c, c) for c in columns], disable_numparse=True)
    summary = tabulate(_method_summary(rows), headers="keys", disable_numparse=True)
    lines = [summary, "", table, "", LEGEND, *([IN_DISTRIBUTION_LEGEND] if marked else []), *_learned_line(rows),
             f"results: {output} (full tables and frontiers: elastic-bench report {output})"]
    if any(str(r.get("device") or "").startswith("cpu") and r.get("prefill_ms") is not None for r in rows):
        lines.append(CPU_CAVEAT)
    return "\n".join(lines)


def _learned_line(rows: list[dict[str, Any]]) -> list[str]:
    """One line naming the learned files each method loaded (``duo_attention: pattern=testbed/duo_gates; ...``), none
    where no method loaded any."""
    found = {}
    for r in rows:
        if r.get("learned_files"):
            found.setdefault(r["method"], ", ".join(f"{k}={v}" for k, v in r["learned_files"].items()))
    return ["learned files: " + "; ".join(f"{method}: {files}" for method, files in found.items())] if found else []


def _method_summary(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Per method (in order of appearance): cells complete and failed, mean score, ΩMSR, ΩESR over its complete cells
    and their median prefill_ms."""
    summary = []
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        complete = [r for r in mine if r["status"] == "complete"]
        summary.append({
            "method": method,
            "complete": f"{len(complete)}/{len(mine)}",
            "failed": str(sum(r["status"] == "failed" for r in mine)),
            "score": _format("score", _over(complete, "score", statistics.fmean)),
            "n": str(sum(r["n"] or 0 for r in complete)),
            **{_HEADERS[k]: _format(k, _over(complete, k, statistics.fmean)) for k in ("omega_msr", "omega_esr")},
            "prefill_ms (median)": _format("prefill_ms", _over(complete, "prefill_ms", statistics.median)),
        })
    return summary


def _over(rows: list[dict[str, Any]], key: str, reduce: Callable[[list[float]], float]) -> float | None:
    """``reduce`` of the ``key`` values of ``rows`` that are set; None where none is."""
    values = [r[key] for r in rows if r[key] is not None]
    return reduce(values) if values else None


def _format(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return f"{value:.{_DECIMALS[column]}f}" if column in _DECIMALS else str(value)
