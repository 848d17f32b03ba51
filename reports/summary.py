"""Comparisons: method configurations side by side on the cells all of them completed, their means and Pareto
frontiers.

Design decisions:
- A configuration is one method folder of one model in one run. `summarize` compares the configurations of each
  model of a run; `compare` those of several runs (methods × runs), all in one comparison.
- Configurations are compared on the same cells only: the (task, length) pairs that *every* configuration completed.
  Cells outside that set are listed as excluded, failed cells with their errors; nothing is averaged over unequal sets.
- Means weigh every comparable cell equally (the RULER convention of averaging task scores).
- Speedup is ``Σ full prefill / Σ method prefill`` over the comparable cells (each cell's median prefill, after the
  runner's untimed warm-up), against the method folder ``full`` of the same run and model; without it there is no
  speedup. Prefill times are those of the prompts timed alone (batch 1): a batched cell's throughput
  (``samples_per_second``) is shown apart and never enters a speedup.
- A speedup frontier is drawn only from prefill times that measure what attention costs (`timing_note`): every
  prefill timed on a GPU (not the CPU, whose attention paths are not the kernels the speedups are about) with a
  compiled kernel backend (not ``reference``, plain PyTorch), and full attention's median prefill at least
  `MIN_FULL_PREFILL_SECONDS` in every comparable cell. Otherwise one sentence says why, in place of the frontier
  and under the speedups.
- A frontier keeps the configurations no other beats on both axes (higher score, and higher ΩESR or speedup).
- Each configuration's mean score carries a 95% interval: the stratified bootstrap of its per-sample scores
  (`bootstrap.mean_interval`, each cell weighing the same as in the mean).
- Paired differences match samples by (task, length, sample id) within the comparable cells.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from .benchmarks import task_category
from .bootstrap import Difference, Interval, mean_interval, paired_difference
from .collect import CellResult
from .labels import folder_label, short_label, unique_labels

BASELINE = "full"
AXES = {"omega_esr": "ΩESR (fraction of causal pairs skipped)", "speedup": f"prefill speedup vs {BASELINE}"}
MIN_FULL_PREFILL_SECONDS = 0.1
"""Full attention's shortest median prefill, in every comparable cell, whose speedups a frontier shows. A forward
costs its kernel launches and Python besides its arithmetic, and no attention method removes that: the shipped testbed
sweep (a 6.8M-parameter model, whose prefills' arithmetic takes well under a millisecond on an H200) times full
attention's median prefill at 40-81 ms per cell, nearly all of it overhead. 100 ms lies above that floor; the
long-context cells the harness is for (7-8B models at 32K tokens and more) take seconds."""

Key = tuple[str, int]  # (task, length)


@dataclass
class Config:
    """One method configuration (``method`` folder of ``model`` in ``run``) over its comparison's cells.

    ``options`` are the method's options and ``artifacts`` the SHA-256 of the learned files it loaded, by option name
    (`CellResult`); ``cells`` maps each comparable (task, length) to its cell; ``score`` (percent), ``omega_msr``,
    ``omega_esr``, ``prefill_seconds`` and ``samples_per_second`` (the batched prompts' throughput, NaN where a cell
    ran none) are means over them; ``score_interval`` is the mean score's 95% interval over the cells' per-sample
    scores; ``speedup`` is against ``full`` of the same run and model (None without it), from prefill times alone;
    ``ceiling`` the mean of its cells' FLOPs ceilings (`CellResult.ceiling`), shown beside the speedup.
    """

    run: str
    model: str
    method: str
    method_name: str
    options: dict
    artifacts: dict
    label: str
    cells: dict[Key, CellResult]
    score: float = math.nan
    omega_msr: float = math.nan
    omega_esr: float = math.nan
    prefill_seconds: float = math.nan
    samples_per_second: float = math.nan
    score_interval: Interval | None = None
    speedup: float | None = None
    ceiling: float = math.nan

    @property
    def devices(self) -> list[str]:
        return sorted({c.device for c in self.cells.values() if c.device})

    @property
    def batch_sizes(self) -> list[int]:
        """The batch sizes its cells' batched prompts ran at (none for cells run at batch 1)."""
        return sorted({c.batch_size for c in self.cells.values() if c.batch_size > 1})

    @property
    def backends(self) -> list[str]:
        return sorted({c.backend for c in self.cells.values() if c.backend})

    @property
    def routes_per_prompt(self) -> bool:
        """Whether the per-head prefill modes differ between prompts (a router, e.g. ``elastic``)."""
        seen = {s.decisions for c in self.cells.values() for s in c.samples if s.decisions is not None}
        return len(seen) > 1


@dataclass
class Frontier:
    """The non-dominated configurations (their labels) on (``axis``, score), in increasing ``axis``."""

    axis: str
    labels: list[str]


@dataclass
class Pair:
    """``a`` − ``b`` in score points over their shared samples, with its paired-bootstrap interval."""

    a: str
    b: str
    difference: Difference


@dataclass
class Comparison:
    """Configurations compared on the cells all of them completed (``keys``), with what fell outside.

    ``speedup_note`` is the sentence that stands in for the speedup frontier when the prefill times do not measure
    attention (`timing_note`; "" otherwise).
    """

    title: str
    configs: list[Config]
    keys: list[Key]
    frontiers: list[Frontier]
    speedup_note: str = ""
    excluded: list[CellResult] = field(default_factory=list)
    failed: list[CellResult] = field(default_factory=list)

    @property
    def tasks(self) -> list[str]:
        return sorted({t for t, _ in self.keys})

    @property
    def lengths(self) -> list[int]:
        return sorted({n for _, n in self.keys})

    @property
    def cells(self) -> list[CellResult]:
        """Every cell of every configuration's comparison."""
        return [c for config in self.configs for c in config.cells.values()]

    def category(self, task: str) -> str:
        """The task's category: its samples' ``metadata.category`` where they carry one, else the benchmark's."""
        found = {s.category for c in self.cells if c.task == task for s in c.samples if s.category}
        return found.pop() if len(found) == 1 else task_category(task)

    def pairs(self) -> list[Pair]:
        """Every pair of configurations: the paired-bootstrap difference of their scores on the shared samples."""
        found = []
        for a, b in combinations(self.configs, 2):
            x, y = paired_scores(a, b)
            found.append(Pair(a.label, b.label, paired_difference(x, y)))
        return found


def paired_scores(a: Config, b: Config, keys: list[Key] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample scores (percent) of ``a`` and ``b`` on the samples both scored, matched by (task, length, id),
    within the cells ``keys`` (None: all of them): two float arrays ``[n]``."""
    keep = set(a.cells if keys is None else keys)
    left = {(*k, s.id): s.score for k, c in a.cells.items() if k in keep for s in c.samples}
    right = {(*k, s.id): s.score for k, c in b.cells.items() if k in keep for s in c.samples}
    shared = sorted(left.keys() & right.keys())
    return np.array([left[k] for k in shared], dtype=float), np.array([right[k] for k in shared], dtype=float)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points ``(x, y)`` not dominated when both coordinates are maximised, sorted by ``x``.

    A point is dominated when another, different point is at least as good on both coordinates; equal points are
    all kept, NaN points never. One sweep in decreasing ``x`` (O(n log n)): a point is on the front when its ``y``
    beats every ``y`` seen before its group of equal points.
    """
    ok = sorted((i for i, (x, y) in enumerate(points) if not (math.isnan(x) or math.isnan(y))),
                key=lambda i: (-points[i][0], -points[i][1]))
    front, best, group_best, previous = [], -math.inf, -math.inf, None
    for i in ok:
        if points[i] != previous:  # a new group of equal points: the groups before it count
            best, previous = max(best, group_best), points[i]
        if points[i][1] > best:
            front.append(i)
        group_best = points[i][1]
    return sorted(front, key=lambda i: points[i])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def timing_note(configs: list[Config]) -> str:
    """Why the prefill times of ``configs`` do not measure what attention costs, as one sentence ("" when they do):
    the rule under which a report draws a speedup frontier. Only configurations with a speedup count: every prefill
    must be timed on a GPU with a compiled backend, and ``full``'s median prefill reach `MIN_FULL_PREFILL_SECONDS` in
    every comparable cell."""
    timed = [c for c in configs if c.speedup is not None]
    cells = [cell for c in timed for cell in c.cells.values()]
    reasons = []
    if any(cell.device.startswith("cpu") for cell in cells):
        reasons.append("some were timed on the CPU, not on the GPU kernels the speedups are about")
    if any(not cell.device for cell in cells):
        reasons.append("some cells record no device")
    if any(cell.backend == "reference" for cell in cells):
        reasons.append("some ran on the `reference` backend (plain PyTorch, no compiled kernel)")
    full = [cell.prefill_seconds for c in timed if c.method == BASELINE for cell in c.cells.values()]
    short = [t for t in full if not t >= MIN_FULL_PREFILL_SECONDS]  # NaN (no time) counts as short
    if short:
        where = f"all {len(full)}" if len(short) == len(full) else f"{len(short)} of {len(full)}"
        reasons.append(f"full attention's median prefill takes {_ms(min(short), max(short))} in {where} comparable "
                       f"cells, under the {_ms(MIN_FULL_PREFILL_SECONDS)} below which a forward's kernel launches and "
                       "Python outweigh its attention")
    if not reasons:
        return ""
    return ("No speedup frontier: these prefill times do not measure what attention costs, because "
            + "; ".join(reasons) + ".")


def _ms(low: float, high: float | None = None) -> str:
    """``low`` (or the range ``low``–``high``) seconds in milliseconds, 3 significant digits."""
    shown = [f"{1000 * t:.3g}" if math.isfinite(t) else "?" for t in ([low] if high in (None, low) else [low, high])]
    return "–".join(shown) + " ms"


def _comparison(title: str, cells: list[CellResult], labels: dict[tuple[str, str, str], str]) -> Comparison:
    """The configurations ``labels`` names ((run, model, method) → label), compared on the cells they all completed."""
    done = [c for c in cells if c.complete]
    runs = list(dict.fromkeys(c.run for c in cells))  # in the order given
    order = sorted(labels, key=lambda k: (runs.index(k[0]), k[1], k[2] != BASELINE, k[2]))
    by_config = {k: {(c.task, c.length): c for c in done if (c.run, c.model, c.method) == k} for k in order}
    shared = set.intersection(*(set(v) for v in by_config.values())) if order else set()
    configs = []
    for k in order:
        first = next(iter(by_config[k].values()))
        used = {key: by_config[k][key] for key in sorted(shared)}
        configs.append(Config(
            run=k[0], model=k[1], method=k[2], method_name=first.method_name, options=first.options,
            artifacts=first.artifacts, label=labels[k], cells=used,
            score=_mean([c.score for c in used.values()]),
            omega_msr=_mean([c.omega_msr for c in used.values()]),
            omega_esr=_mean([c.omega_esr for c in used.values()]),
            prefill_seconds=_mean([c.prefill_seconds for c in used.values()]),
            samples_per_second=_mean([c.samples_per_second for c in used.values()]),
            ceiling=_mean([c.ceiling for c in used.values()]),
            score_interval=mean_interval([np.array([s.score for s in c.samples]) for c in used.values()]),
        ))
    for config in configs:
        base = next((b for b in configs if (b.run, b.model, b.method) == (config.run, config.model, BASELINE)), None)
        if base is not None:
            config.speedup = base.prefill_seconds / config.prefill_seconds if config.prefill_seconds > 0 else math.nan
    note = timing_note(configs)
    frontiers = []
    for axis in AXES:
        points = [(getattr(c, axis), c.score) for c in configs]
        if all(x is None for x, _ in points) or (axis == "speedup" and note):
            continue
        points = [(math.nan if x is None else x, y) for x, y in points]
        frontiers.append(Frontier(axis, [configs[i].label for i in pareto_front(points)]))
    return Comparison(
        title, configs, sorted(shared), frontiers, speedup_note=note,
        excluded=[c for c in done if (c.task, c.length) not in shared],
        failed=[c for c in cells if not c.complete],
    )


def _labels(cells: list[CellResult], prefix) -> dict[tuple[str, str, str], str]:
    """(run, model, method) → a unique readable label: ``prefix(cell)`` + the method's short label."""
    keys = sorted({(c.run, c.model, c.method) for c in cells if c.complete})
    first = {(c.run, c.model, c.method): c for c in reversed(cells) if c.complete}
    short = [prefix(first[k]) + short_label(k[2], first[k].method_name, first[k].options) for k in keys]
    fallback = [prefix(first[k]) + folder_label(k[2]) for k in keys]
    return dict(zip(keys, unique_labels(short, fallback)))


def summarize(cells: list[CellResult]) -> list[Comparison]:
    """One `Comparison` per model in ``cells`` (one run): its method configurations on the cells all completed."""
    found = []
    for model in sorted({c.model for c in cells}):
        mine = [c for c in cells if c.model == model]
        found.append(_comparison(model, mine, _labels(mine, lambda c: "")))
    return found


def compare(cells: list[CellResult]) -> list[Comparison]:
    """One `Comparison` of every configuration of every run in ``cells`` (`CellResult.run` names the run), on the
    cells all of them completed; labels read ``run · method`` (``run · model · method`` when the models differ)."""
    several_models = len({c.model for c in cells}) > 1
    title = "comparison of " + ", ".join(dict.fromkeys(c.run for c in cells))
    return [_comparison(title, cells, _labels(cells, lambda c: f"{c.run} · " + (f"{c.model} · " if several_models
                                                                                 else "")))]
