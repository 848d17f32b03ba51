"""Comparisons: method configurations side by side on the cells all of them completed, their means and Pareto
frontiers, under a benchmark protocol.

Design decisions:
- A configuration is one method folder of one model in one run. `summarize` compares the configurations of each
  model of a run; `compare` those of several runs (methods × runs), all in one comparison.
- A comparison is read under one protocol (`elastic_bench.results.protocols`: ``official`` or ``paper``): cells of a
  task outside the protocol's task set of its benchmark (the paper's RULER has no vt, no cwe) are set apart as
  outside the protocol, and the tables average the rest as the protocol says.
- Configurations are compared on the same cells only: the (task, length) pairs that *every* configuration completed.
  Cells outside that set are listed as excluded, failed cells with their errors; nothing is averaged over unequal sets.
- Means weigh every comparable cell equally (the RULER convention of averaging task scores); the per-benchmark tables
  weigh tasks as the protocol says.
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
- Each configuration's mean score carries a 95% interval: the cluster bootstrap of its per-sample scores
  (`bootstrap.clustered_interval`: a sample id that repeats across a task's lengths is one item, resampled whole;
  stratified by cell, each cell weighing the same as in the mean).
- Paired differences match samples by (task, length, sample id) within the comparable cells, resampled by item
  (task, sample id) and stratified by cell; the pairs of a comparison are one family, their p-values Holm-adjusted
  (`bootstrap.holm`).
- What a configuration's learned files were trained on (``artifact_provenance``) decides what it may be called
  beside a published figure (`Config.kind`): a *reproduction* only when every learned file was trained with the
  paper's recipe, else a *comparison*.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from elastic_bench.results.protocols import OFFICIAL, Protocol
from elastic_bench.results.store import ALLOWED, IN_DISTRIBUTION, in_distribution_mark

from .benchmarks import benchmark_of, task_category
from .bootstrap import RESAMPLES, Difference, Interval, clustered_interval, holm, paired_difference
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
PAPER_RECIPE = "paper"
"""The ``recipe`` of a learned file trained the paper's way (the official mixture by name, the paper's steps)."""
MARK_NOTE = (f"{IN_DISTRIBUTION}: computed from a cell whose task a learned file of the configuration was trained on "
             f"(a shared generator or dataset: in-distribution); {ALLOWED}: the same, scored because the run was given "
             "--allow-in-distribution.")


def mark(cells: Iterable[CellResult]) -> str:
    """The mark of a value computed from ``cells`` (`elastic_bench.results.store.in_distribution_mark`): `ALLOWED`
    where any is in-distribution and allowed, `IN_DISTRIBUTION` where any is in-distribution, else "" (red in the
    HTML report: `ALLOWED`)."""
    found = [c for c in cells if c.in_distribution]
    return in_distribution_mark(found, any(c.allow_in_distribution for c in found))


@dataclass
class Config:
    """One method configuration (``method`` folder of ``model`` in ``run``) over its comparison's cells.

    ``options`` are the method's options, ``artifacts`` the SHA-256 of the learned files it loaded and ``provenance``
    what each was trained on (None: unknown), by option name (`CellResult`); ``cells`` maps each comparable (task,
    length) to its cell; ``score`` (percent), ``omega_msr``, ``omega_esr``, ``prefill_seconds`` and
    ``samples_per_second`` (the batched prompts' throughput, NaN where a cell ran none) are means over them;
    ``score_interval`` is the mean score's 95% interval over the cells' per-sample scores (`sample_interval`);
    ``speedup`` is against ``full`` of the same run and model (None without it), from prefill times alone;
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
    provenance: dict = field(default_factory=dict)

    @property
    def kind(self) -> tuple[str, str]:
        """``("reproduction", "")`` when every learned file was trained with the paper's recipe (or there is none),
        else ``("comparison", why)``: each other file's recipe and data, or that its provenance is unknown."""
        why = []
        for name in self.artifacts:
            found = self.provenance.get(name)
            if found is None:
                why.append(f"{name}: provenance unknown")
            elif found.get("recipe") != PAPER_RECIPE:
                source = (found.get("data") or {}).get("source") or "unknown data"
                why.append(f"{name}: {found.get('recipe') or 'no'} recipe, trained on {source}")
        return ("comparison", "; ".join(why)) if why else ("reproduction", "")

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
    """``a`` − ``b`` in score points over their shared samples, with its paired-bootstrap interval and p-value, and
    ``holm`` the p-value Holm-adjusted over every pair of the comparison."""

    a: str
    b: str
    difference: Difference
    holm: float = 1.0


@dataclass
class Comparison:
    """Configurations compared on the cells all of them completed (``keys``), with what fell outside.

    ``protocol`` is the protocol its tables follow; ``outside`` the complete cells of tasks outside the protocol's
    task sets. ``speedup_note`` is the sentence that stands in for the speedup frontier when the prefill times do not
    measure attention (`timing_note`; "" otherwise).
    """

    title: str
    configs: list[Config]
    keys: list[Key]
    frontiers: list[Frontier]
    speedup_note: str = ""
    excluded: list[CellResult] = field(default_factory=list)
    failed: list[CellResult] = field(default_factory=list)
    protocol: Protocol = OFFICIAL
    outside: list[CellResult] = field(default_factory=list)

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
        """Every pair of configurations: the paired-bootstrap difference of their scores on the shared samples, its
        p-value Holm-adjusted over the family of all pairs."""
        found = [Pair(a.label, b.label, difference(a, b)) for a, b in combinations(self.configs, 2)]
        for pair, adjusted in zip(found, holm([p.difference.p_value for p in found])):
            pair.holm = adjusted
        return found


Item = tuple[str, str]  # (task, sample id): one underlying item, whatever the length


def paired_scores(a: Config, b: Config, keys: list[Key] | None = None,
                  items: set[Item] | None = None) -> tuple[np.ndarray, np.ndarray, list[tuple[str, int, str]]]:
    """Per-sample scores (percent) of ``a`` and ``b`` on the samples both scored, matched by (task, length, id),
    within the cells ``keys`` (None: all of them) and the items ``items`` (None: all): two float arrays ``[n]`` and
    the ``n`` matched (task, length, id)."""
    keep = set(a.cells if keys is None else keys)
    left = {(*k, s.id): s.score for k, c in a.cells.items() if k in keep for s in c.samples}
    right = {(*k, s.id): s.score for k, c in b.cells.items() if k in keep for s in c.samples}
    shared = sorted(k for k in left.keys() & right.keys() if items is None or (k[0], k[2]) in items)
    return (np.array([left[k] for k in shared], dtype=float), np.array([right[k] for k in shared], dtype=float),
            shared)


def difference(a: Config, b: Config, keys: list[Key] | None = None, items: set[Item] | None = None,
               resamples: int = RESAMPLES) -> Difference:
    """``a`` − ``b`` in score points over their matched samples (`paired_scores`), with its paired bootstrap
    interval and p-value, resampled by item and stratified by cell."""
    x, y, shared = paired_scores(a, b, keys, items)
    return paired_difference(x, y, cells=[k[:2] for k in shared], clusters=[(k[0], k[2]) for k in shared],
                             resamples=resamples)


def sample_interval(config: Config, value: str, keys: list[Key] | None = None,
                    weights: dict[Key, float] | None = None, resamples: int = RESAMPLES) -> Interval:
    """The mean of cell means of the per-sample ``value`` (``"score"``, ``"omega_esr"``) of ``config`` over the cells
    ``keys`` (None: all), each cell weighing the same or as ``weights`` says, and its cluster-bootstrap 95% interval
    (`bootstrap.clustered_interval`: items by (task, sample id), stratified by cell)."""
    samples = [(k, s) for k in (config.cells if keys is None else keys) for s in config.cells[k].samples]
    found = clustered_interval(np.array([getattr(s, value) for _, s in samples], dtype=float),
                               cells=[k for k, _ in samples], clusters=[(k[0], s.id) for k, s in samples],
                               weights=weights, resamples=resamples)
    return Interval(found.mean, found.low, found.high, found.n, found.level)


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


def in_protocol(protocol: Protocol, task: str) -> bool:
    """Whether ``task`` belongs to the protocol's task set of its benchmark."""
    return protocol.benchmark(benchmark_of(task).name).includes(task)


def _comparison(title: str, cells: list[CellResult], labels: dict[tuple[str, str, str], str],
                protocol: Protocol) -> Comparison:
    """The configurations ``labels`` names ((run, model, method) → label), compared on the cells they all completed
    among the tasks of ``protocol``."""
    done = [c for c in cells if c.complete]
    inside = [c for c in done if in_protocol(protocol, c.task)]
    runs = list(dict.fromkeys(c.run for c in cells))  # in the order given
    order = sorted((k for k in labels if any((c.run, c.model, c.method) == k for c in inside)),
                   key=lambda k: (runs.index(k[0]), k[1], k[2] != BASELINE, k[2]))
    by_config = {k: {(c.task, c.length): c for c in inside if (c.run, c.model, c.method) == k} for k in order}
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
            provenance={name: first.artifact_provenance.get(name) for name in first.artifacts},
            ceiling=_mean([c.ceiling for c in used.values()]),
        ))
        configs[-1].score_interval = sample_interval(configs[-1], "score")
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
        excluded=[c for c in inside if (c.task, c.length) not in shared],
        failed=[c for c in cells if not c.complete], protocol=protocol,
        outside=[c for c in done if not in_protocol(protocol, c.task)],
    )


def _labels(cells: list[CellResult], prefix) -> dict[tuple[str, str, str], str]:
    """(run, model, method) → a unique readable label: ``prefix(cell)`` + the method's short label."""
    keys = sorted({(c.run, c.model, c.method) for c in cells if c.complete})
    first = {(c.run, c.model, c.method): c for c in reversed(cells) if c.complete}
    short = [prefix(first[k]) + short_label(k[2], first[k].method_name, first[k].options, first[k].learned_files)
             for k in keys]
    fallback = [prefix(first[k]) + folder_label(k[2]) for k in keys]
    return dict(zip(keys, unique_labels(short, fallback)))


def summarize(cells: list[CellResult], protocol: Protocol = OFFICIAL) -> list[Comparison]:
    """One `Comparison` per model in ``cells`` (one run): its method configurations on the cells all completed,
    under ``protocol``."""
    found = []
    for model in sorted({c.model for c in cells}):
        mine = [c for c in cells if c.model == model]
        found.append(_comparison(model, mine, _labels(mine, lambda c: ""), protocol))
    return found


def compare(cells: list[CellResult], protocol: Protocol = OFFICIAL) -> list[Comparison]:
    """One `Comparison` of every configuration of every run in ``cells`` (`CellResult.run` names the run), on the
    cells all of them completed, under ``protocol``; labels read ``run · method`` (``run · model · method`` when the
    models differ)."""
    several_models = len({c.model for c in cells}) > 1
    title = "comparison of " + ", ".join(dict.fromkeys(c.run for c in cells))
    return [_comparison(title, cells, _labels(cells, lambda c: f"{c.run} · " + (f"{c.model} · " if several_models
                                                                                 else "")), protocol)]
