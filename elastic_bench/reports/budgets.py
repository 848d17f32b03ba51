"""Comparisons at equal budgets, and prefill time taken apart: the report's sections "At equal budgets" and "Prefill
time taken apart".

Design decisions:
- A configuration's budget is what its cells record (``calibration`` in ``metrics.json``, written by `elastic-bench
  calibrate`); the run's ``full`` is every budget's reference, and ``oracle`` at a budget the best block selection at
  it. Each configuration is read over every cell it completed (not only the cells every configuration completed: a
  budget that a knob cannot reach at one length fails those cells only), and each pair of configurations is compared
  on the samples both scored (matched by task, length and sample id) with the paired bootstrap
  (`bootstrap.paired_difference`).
- The loss of a method at a budget splits into the budget's, full − oracle, and its selector's, oracle − method, all
  three on the samples the method, the oracle and full scored alike; they add up exactly.
- A prefill's parts are those the runner records (``prefill_parts``: seconds of the model, the method's routing,
  estimation and planning, the harness's pair accounting and the attention kernels, means over the prompts timed
  alone) and ``prefill_unexplained``, the mean prefill less their sum. The share of the ideal speedup takes the ideal
  from the pairs skipped: full attention's prefill with its attention part shortened by ΩESR, ``t_full / (t_full −
  attention_full · ΩESR)``. The crossover length of a method is the shortest measured length from which on its
  speedup over full, a ratio of median prefills with a paired-bootstrap 95% interval over the prompts timed alone,
  lies above 1 at every longer length measured: it lies between the length measured before it and that length.
  Speed figures are shown only where the prefill times measure attention (`summary.timing_note`); otherwise the
  sentence that says why stands in their place.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .bootstrap import LEVEL, RESAMPLES, SEED, Difference, paired_difference
from .collect import CellResult
from .labels import folder_label
from .plots import Plot, _draw, _legend, styles
from .summary import BASELINE, Comparison, Config
from .tables import Table

ORACLE = "oracle"
PART_NAMES = ("model", "routing", "estimation", "planning", "accounting", "attention")  # `kernels.timing.PARTS`
MEASURES = {"omega_esr": "ΩESR", "omega_msr": "ΩMSR"}
Key = tuple[str, int]  # (task, length)


@dataclass
class Section:
    """One heading's tables, plots and notes."""

    heading: str
    tables: list[Table] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Budgeted:
    """A configuration over every cell it completed, with the budget its cells record (None: unbudgeted)."""

    config: Config
    cells: dict[Key, CellResult]
    target: float | None
    measure: str | None

    @property
    def label(self) -> str:
        return self.config.label


def _metrics(cell: CellResult) -> dict:
    return (cell.cell.metrics() if cell.cell is not None else None) or {}


def configurations(comparison: Comparison) -> list[Budgeted]:
    """Every configuration of ``comparison`` over all its complete cells (its comparable cells and its excluded ones),
    with its budget."""
    found = []
    for config in comparison.configs:
        mine = [*config.cells.values(), *(c for c in comparison.excluded
                                          if (c.run, c.model, c.method) == (config.run, config.model, config.method))]
        record = next((r for c in mine if "target" in (r := _metrics(c).get("calibration") or {})), {})
        found.append(Budgeted(config, {(c.task, c.length): c for c in mine}, record.get("target"),
                              record.get("measure")))
    return found


def paired(a: Budgeted, b: Budgeted, *others: Budgeted) -> tuple[np.ndarray, ...]:
    """Per-sample scores (percent) of ``a``, ``b`` and ``others`` on the samples all of them scored (matched by task,
    length and sample id): float arrays ``[n]``, one per configuration."""
    scores = [{(*k, s.id): s.score for k, cell in x.cells.items() for s in cell.samples} for x in (a, b, *others)]
    shared = sorted(set.intersection(*(set(s) for s in scores)))
    return tuple(np.array([s[k] for k in shared], dtype=float) for s in scores)


def sections(comparison: Comparison, key: str) -> list[Section]:
    """The sections of ``comparison``: "At equal budgets" where configurations record budgets, "Prefill time taken
    apart" where prefills record their parts (``key`` prefixes the plots' ids)."""
    configs = configurations(comparison)
    found = []
    if any(c.target is not None for c in configs):
        found.append(equal_budgets(comparison, configs, key))
    if any("prefill_parts" in _metrics(c) for b in configs for c in b.cells.values()):
        found.append(prefill_parts(comparison, configs, key))
    return found


# ---- at equal budgets --------------------------------------------------------------------------------------------


def calibration_table(comparison: Comparison) -> Table:
    """Per budgeted configuration and length: the knob values, the measure on the calibration prompts and its mean
    over the held-out cells, whether both lie within the tolerance, and why a calibration found no value."""
    cells = [*comparison.cells, *comparison.excluded, *comparison.failed]
    labels = {(c.run, c.method): c.label for c in comparison.configs}
    groups: dict[tuple[str, str, int], list[dict]] = {}
    for cell in cells:
        metrics = _metrics(cell)
        if "target" in (metrics.get("calibration") or {}):
            groups.setdefault((cell.run, cell.method, cell.length), []).append(metrics)
    rows = []
    for (run, method, length), found in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1], g[0][2])):
        record = found[0]["calibration"]
        held = [m[record["measure"]] for m in found if m.get("status") == "complete"]
        mean = statistics.mean(held) if held else math.nan
        name = labels.get((run, method)) or " · ".join([*([run] if run else []), folder_label(method)])
        rows.append({"configuration": name, "length": length,
                     "budget": record["target"], "knobs": ", ".join(f"{k}={v:g}" for k, v in record["knobs"].items()),
                     "calibration": record["achieved"], "held out": mean,
                     "within": "yes" if record["within_tolerance"] and abs(mean - record["target"]) <= record[
                         "tolerance"] else "no",
                     "evaluations": record["evaluations"], "note": record.get("error", "")})
    frame = pd.DataFrame(rows).set_index("configuration")
    tolerance = next(iter(groups.values()))[0]["calibration"]["tolerance"] if groups else math.nan
    measure = MEASURES.get(next(iter(groups.values()))[0]["calibration"]["measure"], "") if groups else ""
    return Table("calibration", f"Calibration to each budget ({measure}, tolerance {tolerance:g})", frame,
                 kind="sparsity", kinds={"length": "count", "budget": "sparsity", "knobs": "text", "within": "text",
                                         "evaluations": "count", "note": "text"},
                 note=f"calibration: the mean {measure} on the calibration split (each task's first samples at the "
                      f"length, pooled); held out: its mean over the cells of the held-out samples; within: both lie "
                      f"within the tolerance of the budget. A configuration with a note has no knob value that meets "
                      f"the budget: its cells failed with that reason.")


def _difference_row(name: str, d: Difference) -> dict:
    """``name``: the mean difference, ``name 95%``: its interval as text (``[-8.33, +1.67]``)."""
    shown = "–" if d.n == 0 else f"[{d.low:+.2f}, {d.high:+.2f}]"
    return {name: d.mean, f"{name} 95%": shown}


def scores_table(reference: Budgeted | None, budgeted: list[Budgeted], oracles: dict[float, Budgeted]) -> Table:
    """Per budget and method: the mean score on the samples it shares with full, its held-out measure, and its paired
    difference to full and to the oracle at the same budget (95% intervals)."""
    rows = {}
    for b in sorted(budgeted, key=lambda b: (b.target, b.config.method_name != ORACLE, b.label)):
        row = {"budget": b.target,
               "held-out measure": statistics.mean(c.omega_esr if b.measure == "omega_esr" else c.omega_msr
                                                   for c in b.cells.values())}
        if reference is not None:
            mine, full = paired(b, reference)
            row |= {"score": float(mine.mean()) if mine.size else math.nan, "samples": mine.size,
                    **_difference_row("Δ vs full", paired_difference(mine, full))}
        oracle = oracles.get(b.target)
        if oracle is not None and oracle is not b:
            mine, best = paired(b, oracle)
            row |= _difference_row("Δ vs oracle", paired_difference(mine, best))
        rows[b.label] = row
    frame = pd.DataFrame.from_dict(rows, orient="index").rename_axis("configuration")
    return Table("equal-budgets", "Scores at equal budgets (score points; paired bootstrap 95% intervals)", frame,
                 kind="delta", kinds={"budget": "sparsity", "held-out measure": "sparsity", "score": "score",
                                      "samples": "count", "Δ vs full 95%": "text", "Δ vs oracle 95%": "text"},
                 note="score: the mean per-sample score on the held-out samples the configuration and full both "
                      "scored; Δ: the paired difference on the samples both configurations scored.")


def decomposition_table(reference: Budgeted, budgeted: list[Budgeted], oracles: dict[float, Budgeted]) -> Table:
    """Per method and budget, its loss against full taken apart: the budget's (full − oracle at the budget) and its
    selector's (oracle − method), on the samples all three scored, each with its 95% interval."""
    rows = {}
    for b in sorted(budgeted, key=lambda b: (b.config.method_name, b.target)):
        oracle = oracles.get(b.target)
        if b.config.method_name == ORACLE or oracle is None:
            continue
        mine, best, full = paired(b, oracle, reference)
        rows[b.label] = {"budget": b.target, "samples": mine.size,
                         **_difference_row("loss", paired_difference(full, mine)),
                         **_difference_row("budget's", paired_difference(full, best)),
                         **_difference_row("selector's", paired_difference(best, mine))}
    frame = pd.DataFrame.from_dict(rows, orient="index").rename_axis("configuration")
    return Table("loss-decomposition", "Score loss at each budget, taken apart (score points)", frame, kind="delta",
                 kinds={"budget": "sparsity", "samples": "count", **{f"{n} 95%": "text" for n in ("loss", "budget's",
                                                                                                  "selector's")}},
                 note="loss = full − method = budget's (full − oracle at the budget: what the best choice of blocks "
                      "per head at that budget loses) + selector's (oracle − method: what the method's choice of pairs "
                      "costs beyond it), on the samples the three scored; paired bootstrap 95% intervals. A negative "
                      "selector's loss means the method beats the oracle: the oracle holds every head to the budget "
                      "and ranks blocks by attention mass, while a method may spend the budget unevenly over heads "
                      "(DuoAttention and Elastic keep a retrieval head whole), which a layer's attention mass does not "
                      "tell.")


def budget_plot(reference: Budgeted | None, budgeted: list[Budgeted], comparison: Comparison, key: str) -> Plot:
    """Mean score against the budget, one line per method (95% intervals over its samples), full as a line."""
    look = styles(comparison)

    def paint(fig):
        ax = fig.add_subplot()
        methods = list(dict.fromkeys(b.config.method_name for b in budgeted))
        targets = [b.target for b in budgeted]
        shift = 0.01 * max(max(targets) - min(targets), 0.1)  # methods side by side at a budget: no bar hides another
        for i, method in enumerate(methods):
            mine = sorted((b for b in budgeted if b.config.method_name == method), key=lambda b: b.target)
            points = []
            for b in mine:
                scores = np.array([s.score for c in b.cells.values() for s in c.samples], dtype=float)
                low, high = _mean_interval(scores)
                points.append((b.target, float(scores.mean()), low, high))
            colour, marker = look[mine[0].label]
            x, y, low, high = (np.array(v) for v in zip(*points))
            x = x + (i - (len(methods) - 1) / 2) * shift
            ax.errorbar(x, y, yerr=[y - low, high - y], color=colour, marker=marker, capsize=3,
                        lw=2.2 if method == ORACLE else 1.4, label=method)
        if reference is not None:
            ax.axhline(reference.config.score, color=look[reference.label][0], ls="--", lw=1.2, label=BASELINE)
        ax.set_xlabel("budget (" + MEASURES.get(budgeted[0].measure, "") + ")")
        ax.set_ylabel("mean score (%), 95% interval")
        _legend(ax)

    return Plot(f"{key}-equal-budgets", "Score at equal budgets",
                "Mean score of every method at each budget it reached (bars: 95% bootstrap intervals over its "
                "samples; the methods drawn side by side around each budget); dashed: full attention on the same "
                "held-out prompts.", _draw(9, 4.8, paint))


def _mean_interval(scores: np.ndarray) -> tuple[float, float]:
    from .bootstrap import mean_interval

    found = mean_interval([scores])
    return found.low, found.high


def equal_budgets(comparison: Comparison, configs: list[Budgeted], key: str) -> Section:
    budgeted = [b for b in configs if b.target is not None]
    reference = next((b for b in configs if b.config.method == BASELINE), None)
    oracles = {b.target: b for b in budgeted if b.config.method_name == ORACLE}
    section = Section("At equal budgets", [calibration_table(comparison), scores_table(reference, budgeted, oracles)],
                      [budget_plot(reference, budgeted, comparison, key)])
    if reference is not None and oracles:
        section.tables.append(decomposition_table(reference, budgeted, oracles))
    else:
        section.notes.append("No loss decomposition: it needs full and the oracle at the budgets (run calibrate with "
                             "--methods full,oracle,...).")
    if oracles:
        section.notes.append("The oracle computes full attention to choose its blocks: its prefill time is not a speed "
                             "figure.")
    return section


# ---- prefill time taken apart ------------------------------------------------------------------------------------


def parts_frame(configs: list[Budgeted]) -> pd.DataFrame:
    """One row per configuration and length: the mean seconds of each part over its cells, the unexplained remainder
    and the mean prefill of the prompts the parts were taken of."""
    rows = []
    for b in configs:
        by_length: dict[int, list[dict]] = {}
        for (_, length), cell in b.cells.items():
            metrics = _metrics(cell)
            if "prefill_parts" in metrics:
                by_length.setdefault(length, []).append(metrics)
        for length, found in sorted(by_length.items()):
            parts = {name: statistics.mean(m["prefill_parts"].get(name, 0.0) for m in found) for name in PART_NAMES}
            unexplained = statistics.mean(m["prefill_unexplained"] for m in found)
            rows.append({"label": b.label, "method": b.config.method_name, "length": length, **parts,
                         "unexplained": unexplained, "prefill": sum(parts.values()) + unexplained})
    return pd.DataFrame(rows)


def parts_table(frame: pd.DataFrame) -> Table:
    shown = frame.set_index("label").drop(columns="method")
    for column in [*PART_NAMES, "unexplained", "prefill"]:
        shown[column] = 1000 * shown[column]
    shown["unexplained %"] = 100 * shown["unexplained"] / shown["prefill"]
    shown = shown.rename(columns={c: f"{c} ms" for c in [*PART_NAMES, "unexplained", "prefill"]})
    return Table("prefill-parts", "Prefill time taken apart (mean milliseconds per prompt timed alone)",
                 shown.rename_axis("configuration"), kind="speedup", kinds={"length": "count"},
                 note="model: the model's layers and modules outside attention; routing: the method's plan less the "
                      "parts below (a router, a gate lookup); estimation: block scoring and selection (XAttention's, "
                      "the oracle's dense scores); planning: block lists; accounting: the harness's pair counts "
                      "(ΩMSR, ΩESR), no cost of the method; attention: the kernels; unexplained: the prefill less the "
                      "parts' sum (each part is measured, CUDA events on the GPU, perf_counter on the CPU).")


def parts_plot(frame: pd.DataFrame, key: str) -> Plot:
    """A stacked bar of the parts per configuration, one panel per length."""
    lengths = sorted(frame["length"].unique())
    colours = dict(zip([*PART_NAMES, "unexplained"], ["#7f7f7f", "#1f77b4", "#ff7f0e", "#9467bd", "#bcbd22",
                                                       "#2ca02c", "#d62728"]))

    def paint(fig):
        axes = fig.subplots(1, len(lengths), squeeze=False)[0]
        for ax, length in zip(axes, lengths):
            rows = frame[frame["length"] == length].iloc[::-1]
            left = np.zeros(len(rows))
            for name, colour in colours.items():
                values = 1000 * rows[name].to_numpy()
                ax.barh(rows["label"], values, left=left, color=colour, label=name)
                left += values
            ax.set_title(f"{length} tokens", fontsize=9)
            ax.set_xlabel("ms per prefill")
        _legend(axes[-1])

    height = 1.2 + 0.32 * frame["label"].nunique()
    return Plot(f"{key}-prefill-parts", "Prefill time taken apart",
                "Mean prefill of the prompts timed alone, per part (stacked), per configuration and length.",
                _draw(4 + 4.5 * len(lengths), max(3.0, height), paint))


def speedup_interval(full: np.ndarray, mine: np.ndarray) -> tuple[float, float, float]:
    """The ratio of median prefills ``median(full) / median(mine)`` of paired prompts (float arrays ``[n]``) and its
    percentile bootstrap interval (resampling the prompts, `bootstrap.RESAMPLES`, seeded)."""
    ratio = float(np.median(full) / np.median(mine))
    picks = np.random.default_rng(SEED).integers(0, len(full), size=(RESAMPLES, len(full)))
    ratios = np.median(full[picks], axis=1) / np.median(mine[picks], axis=1)
    low, high = np.quantile(ratios, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return ratio, float(low), float(high)


def _timed(b: Budgeted, length: int) -> dict[tuple[str, str], float]:
    return {(task, r["id"]): r["prefill_seconds"] for (task, n), cell in b.cells.items() if n == length
            and cell.cell is not None for r in cell.cell.predictions() if r.get("prefill_seconds") is not None}


def speed_tables(configs: list[Budgeted], frame: pd.DataFrame) -> list[Table]:
    """The share of the ideal speedup per configuration and length, and each configuration's crossover length."""
    reference = next((b for b in configs if b.config.method == BASELINE), None)
    if reference is None:
        return []
    attention = {r.length: r.attention for r in frame.itertuples() if r.label == reference.label}
    shares, crossings = {}, {}
    for b in configs:
        if b is reference:
            continue
        measured = []
        for length in sorted({n for _, n in b.cells}):
            full, mine = _timed(reference, length), _timed(b, length)
            shared = sorted(full.keys() & mine.keys())
            if not shared:
                continue
            full_times, times = np.array([full[k] for k in shared]), np.array([mine[k] for k in shared])
            speedup, low, high = speedup_interval(full_times, times)
            esr = statistics.mean(c.omega_esr for (_, n), c in b.cells.items() if n == length)
            t_full = float(np.median(full_times))
            ideal = t_full / (t_full - attention[length] * esr) if length in attention else math.nan
            shares[(b.label, length)] = {"configuration": b.label, "length": length, "speedup": speedup,
                                         "95% low": low, "95% high": high, "ΩESR": esr, "ideal": ideal,
                                         "share of ideal": speedup / ideal}
            measured.append((length, speedup, low, high))
        crossings[b.label] = _crossover(measured)
    share = pd.DataFrame(list(shares.values())).set_index("configuration")
    cross = pd.DataFrame.from_dict(crossings, orient="index").rename_axis("configuration")
    return [Table("speedup-share", "Speedup over full and the share of the ideal reached", share, kind="speedup",
                  kinds={"length": "count", "ΩESR": "sparsity"},
                  note="speedup: full's median prefill over the method's, on the prompts both timed alone (paired "
                       "bootstrap 95% interval); ideal: full's prefill with its attention part shortened by ΩESR, "
                       "t_full / (t_full − attention_full · ΩESR); share: speedup / ideal."),
            Table("crossover", "Crossover length: the shortest prompt from which a method beats full", cross,
                  kind="text",
                  note="Measured: the shortest length from which on the speedup's 95% interval lies above 1 at every "
                       "longer length measured; the crossover lies after the length measured before it.")]


def _crossover(measured: list[tuple[int, float, float, float]]) -> dict[str, str]:
    """The crossover of one configuration from its ``(length, speedup, low, high)`` per measured length."""
    lengths = [m[0] for m in measured]
    beats = [low > 1 for _, _, low, _ in measured]
    first = next((i for i in range(len(beats)) if all(beats[i:])), None)
    if first is None:
        return {"crossover": f"not reached by {lengths[-1]}" if lengths else "–", "speedup there": "–",
                "lengths measured": ", ".join(map(str, lengths))}
    length, speedup, low, high = measured[first]
    where = f"≤ {length}" if first == 0 else f"({lengths[first - 1]}, {length}]"
    return {"crossover": where, "speedup there": f"{speedup:.2f} [{low:.2f}, {high:.2f}]",
            "lengths measured": ", ".join(map(str, lengths))}


def prefill_parts(comparison: Comparison, configs: list[Budgeted], key: str) -> Section:
    frame = parts_frame(configs)
    section = Section("Prefill time taken apart", [parts_table(frame)], [parts_plot(frame, key)])
    if comparison.speedup_note:
        section.notes.append(comparison.speedup_note + " The share of the ideal speedup and the crossover lengths are "
                             "not shown.")
    else:
        section.tables += speed_tables(configs, frame)
    return section
