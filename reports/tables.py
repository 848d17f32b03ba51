"""A comparison's tables, as pandas DataFrames: the overview, per-benchmark scores and sparsity, the adaptive-sparsity
table, paired differences, methods × runs, and the legend of configurations.

Design decisions:
- Every table is computed from one long frame of the comparable cells (`cell_frame`: a row per configuration and
  cell) with pandas ``pivot_table`` / ``groupby``; means weigh cells equally, as the summaries do.
- Numbers are formatted per kind of value, the same everywhere (`FORMATS`): scores in percent with 2 decimals,
  sparsities and seconds with 3, speedups and throughputs with 2; a missing value is ``–``.
- Published figures (`published`) and the sparsity within δ of full attention (`free_sparsity`) get a table each.
- Per benchmark: score, ΩMSR and ΩESR per task (tasks as rows, configurations as columns) with the category means
  and the benchmark's average, and the benchmark's breakdown per configuration (`benchmarks.Benchmark`); RULER adds
  its task × length matrix with the average per length.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field

import pandas as pd

from .benchmarks import benchmark_of
from .free_sparsity import FreeSparsity
from .labels import folder_label, folder_options, show_value
from .published import Match
from .summary import BASELINE, Comparison

FORMATS = {"score": "{:.2f}", "sparsity": "{:.3f}", "seconds": "{:.3f}", "speedup": "{:.2f}", "delta": "{:+.2f}",
           "count": "{:.0f}", "throughput": "{:.2f}", "text": "{}"}
"""How each kind of value prints."""

BATCHED_NOTE = ("samples/s (batched): prompts generated per second (prefill and decode) by the prompts a cell ran in "
                "batches of the size shown, a throughput; prefill times and speedups come from the prompts timed "
                "alone (batch 1) only.")

FRONTIER_NAMES = {"omega_esr": "ΩESR", "speedup": "speedup"}
DIGEST_CHARS = 8  # a learned file's SHA-256 as the legend shows it


@dataclass
class Table:
    """One table: ``frame`` holds the values (index: the row names), ``kinds`` the kind of value of each column
    (`FORMATS`; columns not named there are of kind ``kind``); ``note`` is printed under it."""

    id: str
    title: str
    frame: pd.DataFrame
    kind: str = "score"
    kinds: dict[str, str] = field(default_factory=dict)
    note: str = ""

    def formatted(self) -> pd.DataFrame:
        """The values as the report prints them (strings)."""
        out = self.frame.copy().astype(object)
        for column in out.columns:
            fmt = FORMATS[self.kinds.get(column, self.kind)]
            out[column] = [_show(v, fmt) for v in self.frame[column]]
        return out

    def markdown(self) -> str:
        """A Markdown pipe table (tabulate), numbers aligned right; row names, headers and values escaped
        (`escape`)."""
        shown = self.formatted()
        align = ["left"] + ["left" if self.kinds.get(c, self.kind) == "text" else "right" for c in shown.columns]
        shown = shown.map(escape).rename(index=escape, columns=escape)
        shown.index.name = shown.index.name and escape(shown.index.name)
        return shown.to_markdown(disable_numparse=True, colalign=align)


def escape(text) -> str:
    """``text`` with the characters HTML gives a meaning (``&``, ``<``, ``>``) escaped: what a Markdown report shows
    of values it did not write (folder names, task names, error messages), so that none becomes markup."""
    return html.escape(str(text), quote=False)


def _show(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return fmt.format(value)


def slug(text: str) -> str:
    """``text`` as an HTML id and file-name part (lower case, ``-`` between words)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def cell_frame(comparison: Comparison) -> pd.DataFrame:
    """One row per (configuration, comparable cell): ``label, task, length, benchmark, category, score, omega_msr,
    omega_esr, prefill_seconds`` and the cell's official sub-scores as ``score_<name>`` columns."""
    categories = {t: comparison.category(t) for t in comparison.tasks}
    rows = [{"label": config.label, "task": task, "length": length, "benchmark": benchmark_of(task).name,
             "category": categories[task], "score": cell.score, "omega_msr": cell.omega_msr,
             "omega_esr": cell.omega_esr, "prefill_seconds": cell.prefill_seconds,
             **{f"score_{k}": v for k, v in cell.breakdown.items()}}
            for config in comparison.configs for (task, length), cell in config.cells.items()]
    return pd.DataFrame(rows)


def _labels(comparison: Comparison) -> list[str]:
    return [c.label for c in comparison.configs]


def overview(comparison: Comparison) -> Table:
    """Mean score, ΩMSR, ΩESR, median prefill (prompts timed alone), speedup beside its FLOPs ceiling (the model's
    Amdahl bound for the method's plans), the batched prompts' throughput where a cell ran batches, and frontier
    membership per configuration."""
    on_front = {f.axis: set(f.labels) for f in comparison.frontiers}
    speedups = any(c.speedup is not None for c in comparison.configs)
    ceilings = speedups and any(math.isfinite(c.ceiling) for c in comparison.configs)  # cells that record one
    batched = any(math.isfinite(c.samples_per_second) for c in comparison.configs)
    rows = {}
    for c in comparison.configs:
        row = {"mean score": c.score, "ΩMSR": c.omega_msr, "ΩESR": c.omega_esr, "prefill s (median)": c.prefill_seconds}
        if speedups:
            row[f"× {BASELINE}"] = "–" if c.speedup is None else FORMATS["speedup"].format(c.speedup) + (
                " *" if comparison.speedup_note else "")
            if ceilings:
                row["ceiling"] = c.ceiling
        if batched:
            row |= {"samples/s (batched)": c.samples_per_second,
                    "batch": ", ".join(map(str, c.batch_sizes)) or "–"}
        fronts = [FRONTIER_NAMES[axis] for axis, labels in on_front.items() if c.label in labels]
        row |= {"backend": ", ".join(c.backends) or "–", "device": ", ".join(c.devices) or "–",
                "on frontier": ", ".join(fronts) or "–"}
        rows[c.label] = row
    frame = pd.DataFrame.from_dict(rows, orient="index").rename_axis("configuration")
    return Table("overview", "Scores (mean over the comparable cells) and sparsity", frame,
                 kinds={"ΩMSR": "sparsity", "ΩESR": "sparsity", "prefill s (median)": "seconds",
                        f"× {BASELINE}": "text", "ceiling": "speedup", "samples/s (batched)": "throughput",
                        "batch": "text", "backend": "text", "device": "text", "on frontier": "text"},
                 note=" ".join(note for note in (
                     f"* {comparison.speedup_note}" if speedups and comparison.speedup_note else "",
                     BATCHED_NOTE if batched else "") if note))


def _by_task(frame: pd.DataFrame, value: str, labels: list[str]) -> pd.DataFrame:
    """Tasks × configurations of ``value`` (mean over lengths), then one row per category mean and the average."""
    per_task = frame.pivot_table(index="task", columns="label", values=value, aggfunc="mean", dropna=False)
    per_task = per_task.reindex(columns=labels)
    category = frame.drop_duplicates("task").set_index("task")["category"].reindex(per_task.index)
    means = per_task.groupby(category).mean()
    extra = [means.rename(index=lambda c: f"mean · {c}")] if len(means) > 1 else []
    average = per_task.mean().to_frame("average").T
    return pd.concat([per_task, *extra, average]).rename_axis("task")


def _breakdown(frame: pd.DataFrame, by: str, labels: list[str]) -> pd.DataFrame:
    """Configurations × ``by`` (``"length"``, ``"category"``, or ``"official"``: the benchmark's ``score_<name>``
    sub-scores), then the average over tasks."""
    if by == "official":
        columns = [f"score_{c}" for c in benchmark_of(frame["task"].iloc[0]).columns if f"score_{c}" in frame]
        table = frame.groupby("label")[columns].mean().rename(columns=lambda c: c.removeprefix("score_"))
    else:
        per_task = frame.groupby(["label", by, "task"])["score"].mean()
        table = per_task.groupby(["label", by]).mean().unstack(by)
        table.columns = [str(c) for c in table.columns]
    table["average"] = frame.groupby(["label", "task"])["score"].mean().groupby("label").mean()
    return table.reindex(labels).rename_axis("configuration")


def _task_length(frame: pd.DataFrame, labels: list[str]) -> pd.DataFrame:
    """RULER's matrix: (task, length) × configurations, then the average over tasks at each length."""
    cells = frame.pivot_table(index=["task", "length"], columns="label", values="score", aggfunc="mean")
    cells = cells.reindex(columns=labels)
    averages = cells.groupby(level="length").mean()
    averages.index = pd.MultiIndex.from_product([["average"], averages.index], names=["task", "length"])
    both = pd.concat([cells, averages])
    both.index = [f"{task} @ {length}" for task, length in both.index]
    return both.rename_axis("task @ length")


def benchmark_tables(comparison: Comparison) -> list[tuple[str, list[Table]]]:
    """(benchmark name, its tables) for each benchmark among the comparable cells."""
    frame = cell_frame(comparison)
    labels = _labels(comparison)
    found = []
    for name, part in frame.groupby("benchmark", sort=True):
        key = slug(name)
        tables = [Table(f"{key}-score", f"{name}: score by task", _by_task(part, "score", labels))]
        if name == "RULER" and part["length"].nunique() > 1:
            tables.append(Table(f"{key}-task-length", f"{name}: score by task and length", _task_length(part, labels)))
        breakdown = benchmark_of(part["task"].iloc[0]).breakdown
        if part["length"].nunique() > 1 or breakdown == "length":
            tables.append(Table(f"{key}-length", f"{name}: score by length", _breakdown(part, "length", labels)))
        if breakdown != "length":
            title = "the official breakdown" if breakdown == "official" else "category"
            tables.append(Table(f"{key}-{breakdown}", f"{name}: score by {title}", _breakdown(part, breakdown, labels)))
        tables += [
            Table(f"{key}-msr", f"{name}: ΩMSR by task", _by_task(part, "omega_msr", labels), kind="sparsity"),
            Table(f"{key}-esr", f"{name}: ΩESR by task", _by_task(part, "omega_esr", labels), kind="sparsity"),
        ]
        found.append((name, tables))
    return found


def adaptive_sparsity(comparison: Comparison) -> Table:
    """Per configuration, ΩMSR, ΩESR and score per task category side by side: does a method give the
    sparsity-sensitive tasks more full heads than the robust ones? (Category means of task means.)"""
    frame = cell_frame(comparison)
    per_task = frame.groupby(["label", "category", "task"])[["omega_msr", "omega_esr", "score"]].mean()
    means = per_task.groupby(["label", "category"]).mean().unstack("category")
    names = {"omega_msr": "ΩMSR", "omega_esr": "ΩESR", "score": "score"}
    means.columns = [f"{names[value]} · {category}" for value, category in means.columns]
    kinds = {c: "sparsity" for c in means.columns if not c.startswith("score")}
    return Table("adaptive-sparsity", "Adaptive sparsity: ΩMSR, ΩESR and score per task category",
                 means.reindex(_labels(comparison)).rename_axis("configuration"), kinds=kinds,
                 note="Category means of the task means over the comparable cells. A router that adapts gives the "
                      "sparsity-sensitive categories a lower ΩMSR (more full heads) than the robust ones.")


def pair_differences(comparison: Comparison) -> Table:
    """Score difference of every pair of configurations on their shared samples, with a 95% paired-bootstrap
    interval."""
    rows = {f"{p.a} − {p.b}": {"Δ score": p.difference.mean, "95% low": p.difference.low,
                               "95% high": p.difference.high, "samples": p.difference.n,
                               "interval excludes 0": "yes" if p.difference.significant else "no"}
            for p in comparison.pairs()}
    frame = pd.DataFrame.from_dict(rows, orient="index",
                                   columns=["Δ score", "95% low", "95% high", "samples", "interval excludes 0"])
    return Table("pairs", "Paired differences (score points, paired bootstrap 95% interval)",
                 frame.rename_axis("A − B"), kind="delta", kinds={"samples": "count", "interval excludes 0": "text"},
                 note="Samples matched by task, length and sample id; percentile interval of 4000 resamples, fixed "
                      "seed (`elastic_bench.reports.bootstrap`).")


def methods_by_runs(comparison: Comparison) -> Table | None:
    """Methods × runs: mean score, ΩMSR and ΩESR of each method configuration in each run (None for one run)."""
    runs = list(dict.fromkeys(c.run for c in comparison.configs))
    if len(runs) < 2:
        return None
    rows: dict[str, dict[str, float]] = {}
    for c in comparison.configs:
        method = c.label.removeprefix(f"{c.run} · ")
        row = rows.setdefault(method, {})
        row |= {f"score · {c.run}": c.score, f"ΩMSR · {c.run}": c.omega_msr, f"ΩESR · {c.run}": c.omega_esr}
    columns = [f"{value} · {run}" for value in ("score", "ΩMSR", "ΩESR") for run in runs]
    frame = pd.DataFrame.from_dict(rows, orient="index").reindex(columns=columns).rename_axis("method")
    return Table("methods-by-runs", "Methods × runs", frame,
                 kinds={c: "sparsity" for c in columns if not c.startswith("score")})


def legend(comparison: Comparison) -> Table:
    """Each configuration's label beside its run, model and result folder, the options it sets, those it leaves
    unset, and the learned files it loaded (router, gates: the name its folder gives, else the model's own, and the
    first digits of the SHA-256 the cell recorded), so that every option telling two configurations apart is shown."""
    rows = {}
    for c in comparison.configs:
        named = folder_options(c.method, c.method_name)
        names = {key: show_value(named[key]) if key in named else "the model's" for key in c.artifacts}
        files = [f"{key}={names[key]} · {sha[:DIGEST_CHARS]}" for key, sha in c.artifacts.items()]
        rows[c.label] = {
            "run": c.run or "–", "model": c.model, "result folder": folder_label(c.method),
            "options": ", ".join(f"{k}={show_value(v)}" for k, v in c.options.items() if v is not None) or "–",
            "unset": ", ".join(k for k, v in c.options.items() if v is None) or "–",
            "learned files": ", ".join(files) or "–",
        }
    frame = pd.DataFrame.from_dict(rows, orient="index",
                                   columns=["run", "model", "result folder", "options", "unset", "learned files"])
    if not any(c.run for c in comparison.configs):
        frame = frame.drop(columns="run")
    return Table("legend", "Configurations", frame.rename_axis("configuration"), kind="text",
                 note="Unset options take the method's default, which for a method with a learned file is that file's "
                      "own (elastic: the router checkpoint's mode and streaming geometry). Learned files are named as "
                      "their result folder names them and known by their SHA-256.")


def reproduction(found: list[Match], paper: str) -> Table:
    """The published figures ``found`` matched beside their measured values (`published.matches`), with the
    difference measured − published."""
    rows = {}
    for m in found:
        where = f"@ {m.length}" if m.length is not None else "average"
        figure = m.figure
        rows[f"{m.label} · {figure.benchmark} {where}"] = {
            "measured": m.measured, "published": figure.score, "Δ (measured − published)": m.difference,
            "ΩMSR measured": m.measured_msr, "ΩMSR published": figure.omega_msr, "cells": m.cells,
            "source": figure.source + (f" ({figure.note})" if figure.note else ""),
        }
    frame = pd.DataFrame.from_dict(rows, orient="index").rename_axis("configuration · figure")
    return Table("reproduction", "Reproduction: published figures beside the measured ones", frame,
                 kinds={"Δ (measured − published)": "delta", "ΩMSR measured": "sparsity",
                        "ΩMSR published": "sparsity", "cells": "count", "source": "text"},
                 note=f"Published: {paper}. A configuration matches a figure when its model and method are the "
                      "figure's, a sparse method ran under the elastic-paper preset (Elastic in the figure's mode) and "
                      "the comparable cells hold every task the figure averages at its length; measured is the mean "
                      "of those cells (`elastic_bench.reports.published`).")


def free_sparsity_table(found: list[FreeSparsity]) -> Table:
    """Per method and task category, the largest ΩESR within δ of full attention (`free_sparsity.free_sparsity`),
    with the intervals of its ΩESR and of its score difference."""
    rows = {}
    for f in found:
        esr = f.omega_esr
        rows[f"{f.method} · {f.category}"] = {
            "configuration": f.label or f"none within δ (least degraded: Δ low {f.difference.low:+.2f})",
            "ΩESR": esr.mean if esr else None, "ΩESR 95% low": esr.low if esr else None,
            "ΩESR 95% high": esr.high if esr else None, "Δ score vs full": f.difference.mean,
            "Δ 95% low": f.difference.low, "Δ 95% high": f.difference.high, "samples": f.difference.n,
            "configurations": f.tried,
        }
    frame = pd.DataFrame.from_dict(rows, orient="index").rename_axis("method · category")
    delta = found[0].delta if found else 0.0
    return Table("free-sparsity", f"Sparsity for free: the largest ΩESR within δ = {delta:g} score points of full "
                 "attention", frame, kind="sparsity",
                 kinds={"configuration": "text", "Δ score vs full": "delta", "Δ 95% low": "delta",
                        "Δ 95% high": "delta", "samples": "count", "configurations": "count"},
                 note="Per method and task category, among its configurations whose score minus full attention's has "
                      f"a 95% paired-bootstrap interval (matched samples) reaching no lower than −{delta:g}, the one "
                      "with the largest mean ΩESR, with the 95% bootstrap interval of that ΩESR "
                      "(`elastic_bench.reports.free_sparsity`).")
