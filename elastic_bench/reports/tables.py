"""A comparison's tables, as pandas DataFrames: the overview, per-benchmark scores and sparsity, the adaptive-sparsity
table, paired differences, methods × runs, and the legend of configurations.

Design decisions:
- Every table is computed from one long frame of the comparable cells (`cell_frame`: a row per configuration and
  cell) with pandas ``pivot_table`` / ``groupby``. The overview's means weigh cells equally, as the summaries do; a
  benchmark's average over its tasks is its protocol's (`elastic_bench.results.protocols`: equal, or weighted by the
  tasks' items), category means weigh a category's tasks equally (the paper's Table 8 does).
- Every table names the protocol it shows (`Table.protocol`).
- Every value computed from an in-distribution cell (a learned file of the configuration was trained on the task's
  generator or dataset) carries a mark (`Table.marks`: `summary.IN_DISTRIBUTION`, or `summary.ALLOWED` where the
  run was told to score such cells, which the HTML page prints in red). A table's marks come from building it again
  from the cells' 0/1 in-distribution indicators in place of their values: every aggregate is a mean with positive
  weights, so it is above 0 exactly when one of its cells is marked.
- Numbers are formatted per kind of value, the same everywhere (`FORMATS`): scores in percent with 2 decimals,
  sparsities and seconds with 3, speedups and throughputs with 2; a missing value is ``–``.
- Published figures (`published`) and the sparsity within δ of full attention (`free_sparsity`) get a table each.
- Per benchmark: score, ΩMSR and ΩESR per task (tasks as rows, configurations as columns) with the category means
  and the benchmark's average, and the benchmark's breakdown per configuration (`benchmarks.Benchmark`); RULER adds
  its task × length matrix with the average per length.
- The paired differences of a comparison are one family: each pair's bootstrap p-value is shown beside its
  Holm-adjusted one, and a pair differs when the adjusted one is below 5%.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from elastic_bench.results.protocols import BenchmarkProtocol

from .benchmarks import benchmark_of
from .bootstrap import LEVEL, RESAMPLES
from .free_sparsity import METHOD, FreeSparsity
from .labels import folder_label, folder_options, show_value
from .published import Match
from .summary import ALLOWED, BASELINE, IN_DISTRIBUTION, MARK_NOTE, Comparison, Config, mark

FORMATS = {"score": "{:.2f}", "sparsity": "{:.3f}", "seconds": "{:.3f}", "speedup": "{:.2f}", "delta": "{:+.2f}",
           "count": "{:.0f}", "throughput": "{:.2f}", "pvalue": "{:.4f}", "text": "{}"}
"""How each kind of value prints."""

BATCHED_NOTE = ("samples/s (batched): prompts generated per second (prefill and decode) by the prompts a cell ran in "
                "batches of the size shown, a throughput; prefill times and speedups come from the prompts timed "
                "alone (batch 1) only.")

FRONTIER_NAMES = {"omega_esr": "ΩESR", "speedup": "speedup"}
DIGEST_CHARS = 8  # a learned file's SHA-256 as the legend shows it
ALPHA = 1 - LEVEL  # the family-wise error rate of the paired differences' "differs"


@dataclass
class Table:
    """One table: ``frame`` holds the values (index: the row names), ``kinds`` the kind of value of each column
    (`FORMATS`; columns not named there are of kind ``kind``); ``note`` is printed under it; ``protocol`` names the
    protocol it shows; ``marks`` (same index and columns as ``frame``, or None) holds each value's in-distribution
    mark ("" for none)."""

    id: str
    title: str
    frame: pd.DataFrame
    kind: str = "score"
    kinds: dict[str, str] = field(default_factory=dict)
    note: str = ""
    protocol: str = ""
    marks: pd.DataFrame | None = None

    def mark(self, row, column) -> str:
        """The in-distribution mark of one value ("" for none)."""
        if self.marks is None or column not in self.marks.columns:
            return ""
        return str(self.marks.at[row, column] or "")

    def formatted(self) -> pd.DataFrame:
        """The values as the report prints them (strings), each followed by its mark."""
        out = self.frame.copy().astype(object)
        for column in out.columns:
            fmt = FORMATS[self.kinds.get(column, self.kind)]
            out[column] = [_show(v, fmt) for v in self.frame[column]]
        if self.marks is not None:
            marks = self.marks.reindex(index=out.index, columns=out.columns, fill_value="")
            out = out.where(marks == "", out + " " + marks)
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


VALUES = ("score", "omega_msr", "omega_esr", "prefill_seconds")


def cell_frame(comparison: Comparison) -> pd.DataFrame:
    """One row per (configuration, comparable cell): ``label, task, length, benchmark, category, score, omega_msr,
    omega_esr, prefill_seconds``, the cell's official sub-scores as ``score_<name>`` columns, and its 0/1
    ``in_distribution`` and ``allowed`` (in-distribution, scored under ``--allow-in-distribution``) indicators."""
    categories = {t: comparison.category(t) for t in comparison.tasks}
    rows = [{"label": config.label, "task": task, "length": length, "benchmark": benchmark_of(task).name,
             "category": categories[task], "score": cell.score, "omega_msr": cell.omega_msr,
             "omega_esr": cell.omega_esr, "prefill_seconds": cell.prefill_seconds,
             "in_distribution": float(bool(cell.in_distribution)),
             "allowed": float(bool(cell.in_distribution) and cell.allow_in_distribution),
             **{f"score_{k}": v for k, v in cell.breakdown.items()}}
            for config in comparison.configs for (task, length), cell in config.cells.items()]
    return pd.DataFrame(rows)


def _marks(frame: pd.DataFrame, build) -> pd.DataFrame | None:
    """The marks of the table ``build(frame)`` (module doc): ``build`` run on the cells' indicators in place of their
    values; None where no cell is in-distribution."""
    if frame.empty or not frame["in_distribution"].any():
        return None

    def indicator(column: str) -> pd.DataFrame:
        values = [c for c in frame.columns if c in VALUES or c.startswith("score_")]
        return build(frame.assign(**{c: frame[column] for c in values})).astype(float).fillna(0.0)

    flagged, allowed = indicator("in_distribution"), indicator("allowed")
    return pd.DataFrame(np.where(allowed > 0, ALLOWED, np.where(flagged > 0, IN_DISTRIBUTION, "")),
                        index=flagged.index, columns=flagged.columns)


def _row_marks(frame: pd.DataFrame, comparison: Comparison, columns: list[str],
               configs: dict[str, Config] | None = None) -> pd.DataFrame | None:
    """Marks of a table whose rows are configurations (``configs``: row name → configuration; default: by label):
    each of ``columns`` carries its row's configuration's mark over its comparable cells."""
    configs = configs if configs is not None else {c.label: c for c in comparison.configs}
    found = {row: mark(config.cells.values()) for row, config in configs.items()}
    if not any(found.values()):
        return None
    return pd.DataFrame({column: [found.get(row, "") for row in frame.index] for column in columns}, index=frame.index)


def _over_tasks(per_task: pd.Series, bench: BenchmarkProtocol) -> pd.Series:
    """``per_task`` (a Series indexed by (..., task)) reduced over its last level, the tasks, by the protocol's mean
    (equal, or weighted by the tasks' items), for each group of the other levels."""
    levels = list(range(per_task.index.nlevels - 1))
    return per_task.groupby(level=levels).apply(
        lambda s: bench.task_mean(dict(zip(s.index.get_level_values(-1), s.to_numpy()))))


def _protocol_of(comparison: Comparison, frame: pd.DataFrame) -> BenchmarkProtocol:
    """The protocol's declaration of the benchmark of ``frame``'s tasks (one benchmark)."""
    return comparison.protocol.benchmark(benchmark_of(frame["task"].iloc[0]).name)


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
        row = {"mean score": c.score, "samples": samples(c.cells.values()), "ΩMSR": c.omega_msr, "ΩESR": c.omega_esr,
               "prefill s (median)": c.prefill_seconds}
        if speedups:
            row[f"× {BASELINE}"] = "–" if c.speedup is None else (
                not_a_speedup(c.devices) if comparison.speedup_note else FORMATS["speedup"].format(c.speedup))
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
    marks = _row_marks(frame, comparison, ["mean score", "ΩMSR", "ΩESR"])
    return Table("overview", "Scores (mean over the comparable cells) and sparsity", frame,
                 protocol=comparison.protocol.name, marks=marks,
                 kinds={"samples": "text", "ΩMSR": "sparsity", "ΩESR": "sparsity", "prefill s (median)": "seconds",
                        f"× {BASELINE}": "text", "ceiling": "speedup", "samples/s (batched)": "throughput",
                        "batch": "text", "backend": "text", "device": "text", "on frontier": "text"},
                 note=" ".join(note for note in (
                     f"× {BASELINE}: {comparison.speedup_note}" if speedups and comparison.speedup_note else "",
                     BATCHED_NOTE if batched else "", MARK_NOTE if marks is not None else "") if note))


def samples(cells) -> str:
    """The samples behind a mean score of ``cells`` (`CellResult`s), ``36 (3 per cell)``: how far the score can be
    read."""
    counts = [c.num_samples for c in cells]
    return f"{sum(counts)} ({per_cell(counts)} per cell)" if counts else "–"


def per_cell(counts: list[int]) -> str:
    """Samples per cell: ``3``, or the range ``2–4`` where cells differ (``–`` for none)."""
    if not counts:
        return "–"
    return str(min(counts)) if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"


def not_a_speedup(devices: list[str]) -> str:
    """What the speedup column holds where the prefill times do not measure attention (`Comparison.speedup_note`):
    the reason in short, in place of a ratio that would read as a speedup."""
    return "none: CPU timing" if any(d.startswith("cpu") for d in devices) else "none: see the note"


def _by_task(frame: pd.DataFrame, value: str, labels: list[str], bench: BenchmarkProtocol) -> pd.DataFrame:
    """Tasks × configurations of ``value`` (mean over lengths), then one row per category mean (equal over its
    tasks) and the protocol's average over the tasks."""
    per_task = frame.pivot_table(index="task", columns="label", values=value, aggfunc="mean", dropna=False)
    per_task = per_task.reindex(columns=labels)
    category = frame.drop_duplicates("task").set_index("task")["category"].reindex(per_task.index)
    means = per_task.groupby(category).mean()
    extra = [means.rename(index=lambda c: f"mean · {c}")] if len(means) > 1 else []
    average = per_task.apply(lambda column: bench.task_mean(column.to_dict())).to_frame("average").T
    return pd.concat([per_task, *extra, average]).rename_axis("task")


def _breakdown(frame: pd.DataFrame, by: str, labels: list[str], bench: BenchmarkProtocol) -> pd.DataFrame:
    """Configurations × ``by`` (``"length"``, ``"category"``, or ``"official"``: the benchmark's ``score_<name>``
    sub-scores), then the protocol's average over the tasks. A length or sub-score column is the protocol's mean over
    the tasks, a category column the equal mean of its tasks."""
    if by == "official":
        columns = [f"score_{c}" for c in benchmark_of(frame["task"].iloc[0]).columns if f"score_{c}" in frame]
        per_task = frame.groupby(["label", "task"])[columns].mean()
        table = pd.DataFrame({c.removeprefix("score_"): _over_tasks(per_task[c], bench) for c in columns})
    else:
        per_task = frame.groupby(["label", by, "task"])["score"].mean()
        means = per_task.groupby(["label", by]).mean() if by == "category" else _over_tasks(per_task, bench)
        table = means.unstack(by)
        table.columns = [str(c) for c in table.columns]
    table["average"] = _over_tasks(frame.groupby(["label", "task"])["score"].mean(), bench)
    return table.reindex(labels).rename_axis("configuration")


def _task_length(frame: pd.DataFrame, labels: list[str], bench: BenchmarkProtocol) -> pd.DataFrame:
    """RULER's matrix: (task, length) × configurations, then the protocol's average over the tasks at each length."""
    cells = frame.pivot_table(index=["task", "length"], columns="label", values="score", aggfunc="mean")
    cells = cells.reindex(columns=labels)
    by_length = cells.stack(future_stack=True).reorder_levels(["length", "label", "task"]).sort_index()
    averages = _over_tasks(by_length, bench).unstack("label").reindex(columns=labels)
    averages.index = pd.MultiIndex.from_product([["average"], averages.index], names=["task", "length"])
    both = pd.concat([cells, averages])
    both.index = [f"{task} @ {length}" for task, length in both.index]
    return both.rename_axis("task @ length")


def _table(comparison: Comparison, part: pd.DataFrame, id: str, title: str, build, kind: str = "score") -> Table:
    """A table of the cells ``part`` built by ``build(frame)``, with its marks and its protocol."""
    marks = _marks(part, build)
    return Table(id, title, build(part), kind=kind, protocol=comparison.protocol.name, marks=marks,
                 note=MARK_NOTE if marks is not None else "")


def benchmark_tables(comparison: Comparison) -> list[tuple[str, list[Table]]]:
    """(benchmark name, its tables) for each benchmark among the comparable cells."""
    frame = cell_frame(comparison)
    return [(name, _benchmark(comparison, name, part)) for name, part in frame.groupby("benchmark", sort=True)]


def _benchmark(comparison: Comparison, name: str, part: pd.DataFrame) -> list[Table]:
    """The tables of one benchmark, from its cells ``part`` of `cell_frame`."""
    labels, key, bench = _labels(comparison), slug(name), _protocol_of(comparison, part)

    def table(id: str, title: str, build, kind: str = "score") -> Table:
        return _table(comparison, part, f"{key}-{id}", f"{name}: {title}", build, kind)

    tables = [table("score", "score by task", lambda f: _by_task(f, "score", labels, bench))]
    if name == "RULER" and part["length"].nunique() > 1:
        tables.append(table("task-length", "score by task and length", lambda f: _task_length(f, labels, bench)))
    breakdown = benchmark_of(part["task"].iloc[0]).breakdown
    if part["length"].nunique() > 1 or breakdown == "length":
        tables.append(table("length", "score by length", lambda f: _breakdown(f, "length", labels, bench)))
    if breakdown != "length":
        title = "the official breakdown" if breakdown == "official" else "category"
        tables.append(table(breakdown, f"score by {title}", lambda f: _breakdown(f, breakdown, labels, bench)))
    return tables + [
        table("msr", "ΩMSR by task", lambda f: _by_task(f, "omega_msr", labels, bench), kind="sparsity"),
        table("esr", "ΩESR by task", lambda f: _by_task(f, "omega_esr", labels, bench), kind="sparsity"),
    ]


def adaptive_sparsity(comparison: Comparison) -> Table:
    """Per configuration, ΩMSR, ΩESR and score per task category side by side: does a method give the
    sparsity-sensitive tasks more full heads than the robust ones? (Category means of task means.)"""
    names = {"omega_msr": "ΩMSR", "omega_esr": "ΩESR", "score": "score"}

    def build(frame: pd.DataFrame) -> pd.DataFrame:
        per_task = frame.groupby(["label", "category", "task"])[["omega_msr", "omega_esr", "score"]].mean()
        means = per_task.groupby(["label", "category"]).mean().unstack("category")
        means.columns = [f"{names[value]} · {category}" for value, category in means.columns]
        return means.reindex(_labels(comparison)).rename_axis("configuration")

    table = _table(comparison, cell_frame(comparison), "adaptive-sparsity",
                   "Adaptive sparsity: ΩMSR, ΩESR and score per task category", build)
    table.kinds = {c: "sparsity" for c in table.frame.columns if not c.startswith("score")}
    table.note = " ".join(n for n in ("Category means of the task means over the comparable cells. A router that "
                                      "adapts gives the sparsity-sensitive categories a lower ΩMSR (more full heads) "
                                      "than the robust ones.", table.note) if n)
    return table


def pair_differences(comparison: Comparison) -> Table:
    """Score difference of every pair of configurations on their shared samples, with a 95% paired-bootstrap
    interval, its p-value and the p-value Holm-adjusted over every pair of the comparison."""
    pairs = comparison.pairs()
    rows = {f"{p.a} − {p.b}": {"Δ score": p.difference.mean, "95% low": p.difference.low,
                               "95% high": p.difference.high, "samples": p.difference.n,
                               "p": p.difference.p_value, "p (Holm)": p.holm,
                               f"differs (Holm, {100 * ALPHA:g}%)": "yes" if p.holm < ALPHA else "no"}
            for p in pairs}
    columns = ["Δ score", "95% low", "95% high", "samples", "p", "p (Holm)", f"differs (Holm, {100 * ALPHA:g}%)"]
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=columns).rename_axis("A − B")
    configs = {c.label: c for c in comparison.configs}
    marks = {f"{p.a} − {p.b}": mark([*configs[p.a].cells.values(), *configs[p.b].cells.values()]) for p in pairs}
    return Table("pairs", "Paired differences (score points, paired bootstrap 95% interval, Holm-adjusted)", frame,
                 kind="delta", kinds={"samples": "count", "p": "pvalue", "p (Holm)": "pvalue", columns[-1]: "text"},
                 protocol=comparison.protocol.name,
                 marks=pd.DataFrame({"Δ score": [marks[r] for r in frame.index]}, index=frame.index)
                 if any(marks.values()) else None,
                 note=f"Samples matched by task, length and sample id, resampled by item (a sample id at every length "
                      f"of a task is one item) within each cell; percentile interval of {RESAMPLES} resamples, fixed "
                      f"seed (`elastic_bench.reports.bootstrap`). The {len(pairs)} pairs are one family: a pair "
                      f"differs when its p-value, Holm-adjusted over the family (Holm 1979), is below "
                      f"{100 * ALPHA:g}%, which keeps the chance of any false \"differs\" at {100 * ALPHA:g}%."
                      + (f" {MARK_NOTE}" if any(marks.values()) else ""))


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
    found = {(c.label.removeprefix(f"{c.run} · "), run): mark(c.cells.values())
             for c in comparison.configs for run in runs if c.run == run}
    marks = pd.DataFrame({column: [found.get((method, column.split(" · ", 1)[1]), "") for method in frame.index]
                          for column in columns}, index=frame.index)
    shown = marks if (marks != "").any().any() else None
    return Table("methods-by-runs", "Methods × runs", frame,
                 kinds={c: "sparsity" for c in columns if not c.startswith("score")},
                 protocol=comparison.protocol.name, marks=shown, note=MARK_NOTE if shown is not None else "")


def trained_on(config: Config) -> str:
    """What each learned file of ``config`` was trained on, as its provenance records it: ``router: records
    (ruler_niah_single_1, …), 768 records at 1024-4096 tokens, 300 steps, custom recipe``; "provenance unknown"
    for a file that records none."""
    shown = []
    for name in config.artifacts:
        found = config.provenance.get(name)
        if found is None:
            shown.append(f"{name}: provenance unknown")
            continue
        data = found.get("data") or {}
        tasks = sorted(data.get("tasks") or {})
        lengths = data.get("lengths") or []
        parts = [f"{data.get('source') or 'unknown data'}" + (f" ({', '.join(tasks)})" if tasks else ""),
                 f"{data['records']} records" if data.get("records") else "",
                 f"at {lengths[0]}-{lengths[-1]} tokens" if len(lengths) == 2 else "",
                 f"{found['steps']} steps" if found.get("steps") else "", f"{found.get('recipe') or 'no'} recipe"]
        shown.append(f"{name}: " + ", ".join(p for p in parts if p))
    return "; ".join(shown) or "–"


def legend(comparison: Comparison) -> Table:
    """Each configuration's label beside its run, model and result folder, the options it sets, those it leaves
    unset, and the learned files it loaded (router, gates: the name its folder gives, else the name its cells record,
    e.g. ``testbed/duo_gates`` for the model's own, and the first digits of the SHA-256 the cell recorded), so that
    every option telling two configurations apart is shown."""
    rows = {}
    for c in comparison.configs:
        named = folder_options(c.method, c.method_name)
        recorded = next((cell.learned_files for cell in c.cells.values()), {})
        names = {key: show_value(named[key]) if key in named else recorded.get(key, "the model's")
                 for key in c.artifacts}
        files = [f"{key}={names[key]} · {sha[:DIGEST_CHARS]}" for key, sha in c.artifacts.items()]
        rows[c.label] = {
            "run": c.run or "–", "model": c.model, "result folder": folder_label(c.method),
            "options": ", ".join(f"{k}={show_value(v)}" for k, v in c.options.items() if v is not None) or "–",
            "unset": ", ".join(k for k, v in c.options.items() if v is None) or "–",
            "learned files": ", ".join(files) or "–",
            "trained on": trained_on(c),
        }
    columns = ["run", "model", "result folder", "options", "unset", "learned files", "trained on"]
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=columns)
    if not any(c.run for c in comparison.configs):
        frame = frame.drop(columns="run")
    if not any(c.artifacts for c in comparison.configs):
        frame = frame.drop(columns="trained on")
    return Table("legend", "Configurations", frame.rename_axis("configuration"), kind="text",
                 protocol=comparison.protocol.name,
                 note="Unset options take the method's default, which for a method with a learned file is that file's "
                      "own (elastic: the router checkpoint's mode and streaming geometry). Learned files are named as "
                      "their result folder names them and known by their SHA-256; \"trained on\" is what each file's "
                      "provenance records (a file written before provenance was recorded, or a released checkpoint, "
                      "reads \"provenance unknown\").")


REPRODUCTION_TITLE = "Published figures beside the measured ones: reproductions and comparisons"


def reproduction(found: list[Match], paper: str) -> Table:
    """The published figures ``found`` matched beside their measured values (`published.matches`), with the
    difference measured − published, each row a reproduction or a comparison (and why); where a printed average is
    not the one its printed columns give, both, and the difference with each."""
    both = any(m.shows_both for m in found)
    rows, marks = {}, {}
    for m in found:
        where = f"@ {m.length}" if m.length is not None else "average"
        figure = m.figure
        name = f"{m.label} · {figure.name} {where}"
        rows[name] = {
            "kind": m.kind + (f" ({m.why})" if m.why else ""),
            "measured": m.measured, "published": figure.score, "Δ (measured − published)": m.difference,
            **({"published, from its columns": m.recomputed if m.shows_both else None,
                "Δ (measured − from its columns)": m.measured - m.recomputed if m.shows_both else None}
               if both else {}),
            "ΩMSR measured": m.measured_msr, "ΩMSR published": figure.omega_msr, "cells": m.cells,
            "source": figure.source + (f" ({figure.note})" if figure.note else ""),
            "items": m.items or "–",
        }
        marks[name] = m.mark
    frame = pd.DataFrame.from_dict(rows, orient="index").rename_axis("configuration · figure")
    shown = (pd.DataFrame({"measured": [marks[r] for r in frame.index]}, index=frame.index)
             if any(marks.values()) else None)
    protocol = found[0].protocol if found else ""
    return Table("reproduction", REPRODUCTION_TITLE, frame,
                 kinds={"kind": "text", "Δ (measured − published)": "delta", "Δ (measured − from its columns)": "delta",
                        "ΩMSR measured": "sparsity", "ΩMSR published": "sparsity", "cells": "count", "source": "text",
                        "items": "text"},
                 protocol=protocol, marks=shown,
                 note=" ".join(n for n in (
                     f"Published: {paper}, under its own protocol (`{protocol}`): measured values are computed as the "
                     "paper computes its figures, whatever protocol the other tables follow. A configuration matches a "
                     "figure when its model and method are the figure's, a sparse method ran under the elastic-paper "
                     "preset (Elastic in the figure's mode) and the comparable cells hold every task the figure "
                     "averages at its length (`elastic_bench.reports.published`). A row is a reproduction only when "
                     "every learned file of the configuration was trained with the paper's recipe (the official "
                     "mixture by name, the paper's steps); otherwise it is a comparison, and says why.",
                     "Where the paper's printed average is not the one its own printed columns give under the "
                     "protocol (its RULER Avg is not the mean of its six lengths on most rows), both are shown: "
                     "\"published\" is the printed one, \"published, from its columns\" the recomputed one." if both
                     else "",
                     "Where the paper's items cannot be identified from public data, \"items\" says so; the measured "
                     "value is then over the run's items." if any(m.items for m in found) else "",
                     MARK_NOTE if shown is not None else "") if n))


def free_sparsity_table(found: list[FreeSparsity], protocol: str = "") -> Table:
    """Per method and task category, the sparsest configuration within δ of full attention, chosen on one half of
    the items and confirmed on the other (`free_sparsity.free_sparsity`), with the intervals of its ΩESR and of its
    held-out score difference."""
    rows, marks = {}, {}
    for f in found:
        esr = f.omega_esr
        name = f"{f.method} · {f.category}"
        rows[name] = {
            "configuration": f.label or f"none within δ (least degraded: Δ low {f.difference.low:+.2f})",
            "within δ (held-out half)": ("yes" if f.confirmed else "not confirmed") if f.label else "–",
            "ΩESR": esr.mean if esr else None, "ΩESR 95% low": esr.low if esr else None,
            "ΩESR 95% high": esr.high if esr else None, "Δ score vs full": f.difference.mean,
            "Δ 95% low": f.difference.low, "Δ 95% high": f.difference.high, "samples": f.difference.n,
            "configurations": f.tried,
        }
        marks[name] = f.mark
    frame = pd.DataFrame.from_dict(rows, orient="index").rename_axis("method · category")
    shown = (pd.DataFrame({"configuration": [marks[r] for r in frame.index]}, index=frame.index)
             if any(marks.values()) else None)
    delta = found[0].delta if found else 0.0
    return Table("free-sparsity", f"Sparsity for free: the largest ΩESR within δ = {delta:g} score points of full "
                 "attention", frame, kind="sparsity",
                 kinds={"configuration": "text", "within δ (held-out half)": "text", "Δ score vs full": "delta",
                        "Δ 95% low": "delta", "Δ 95% high": "delta", "samples": "count", "configurations": "count"},
                 protocol=protocol, marks=shown,
                 note=f"Selection: {METHOD}. Per method and task category, the items are split in two halves (every "
                      "length of an item on one side); on the first, among the configurations whose score minus full "
                      f"attention's has a 95% paired-bootstrap interval reaching no lower than −{delta:g}, the one "
                      "with the largest mean ΩESR is chosen; the claim \"within δ\" stands only if that "
                      "configuration's interval on the held-out half also reaches no lower than −δ (the Δ columns are "
                      "the held-out half's; for \"none within δ\", the first half's of the least-degraded "
                      "configuration). ΩESR and its interval are over all the category's samples "
                      "(`elastic_bench.reports.free_sparsity`)."
                      + (f" {MARK_NOTE}" if shown is not None else ""))
