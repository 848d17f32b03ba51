"""Per-model summaries of a run: method means over the cells every method completed, and Pareto frontiers.

Design decisions:
- Methods are compared on the same cells only: the (task, length) pairs that *every* method of the model completed.
  Cells outside that set are listed as excluded, failed cells with their errors; nothing is averaged over unequal sets.
- Means weigh every comparable cell equally (the RULER convention of averaging task scores).
- Speedup is ``Σ full prefill / Σ method prefill`` over the comparable cells (each cell's median prefill, after the
  runner's untimed warm-up), against the method folder ``full`` of the same model; without it there is no speedup
  column or frontier. Prefills timed on the CPU or on the ``reference`` backend do not measure kernel speed (masked
  attention costs more than dense there): the report says so beside such speedups.
- A frontier keeps the methods no other method beats on both axes (higher score, and higher ΩESR or speedup).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .collect import CellResult

BASELINE = "full"
AXES = {"omega_esr": "ΩESR (fraction of causal pairs skipped)", "speedup": f"prefill speedup vs {BASELINE}"}


@dataclass
class MethodSummary:
    """One method of one model, over the model's comparable cells."""

    method: str
    score: float
    task_scores: dict[str, float]
    length_scores: dict[int, float]
    omega_msr: float
    omega_esr: float
    prefill_seconds: float
    speedup: float | None
    devices: list[str] = field(default_factory=list)
    backends: list[str] = field(default_factory=list)

    @property
    def measures_kernels(self) -> bool:
        """Whether every prefill was timed on a GPU with a kernel backend (not the CPU, not ``reference``)."""
        return bool(self.devices) and not any(d.startswith("cpu") for d in self.devices) and "reference" not in \
            self.backends


@dataclass
class Frontier:
    """The non-dominated methods on (``axis``, score), in increasing ``axis``."""

    axis: str
    methods: list[str]


@dataclass
class ModelReport:
    model: str
    tasks: list[str]
    lengths: list[int]
    methods: list[MethodSummary]
    frontiers: list[Frontier]
    excluded: list[CellResult] = field(default_factory=list)
    failed: list[CellResult] = field(default_factory=list)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points ``(x, y)`` not dominated when both coordinates are maximised (NaN points never are on
    the front; equal points both are), sorted by ``x``."""
    ok = [i for i, (x, y) in enumerate(points) if not (math.isnan(x) or math.isnan(y))]

    def dominated(i: int) -> bool:
        xi, yi = points[i]
        return any(points[j][0] >= xi and points[j][1] >= yi and points[j] != points[i] for j in ok)

    return sorted((i for i in ok if not dominated(i)), key=lambda i: points[i])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def summarize(cells: list[CellResult]) -> list[ModelReport]:
    """One `ModelReport` per model in ``cells``."""
    reports = []
    for model in sorted({c.model for c in cells}):
        mine = [c for c in cells if c.model == model]
        done = [c for c in mine if c.complete]
        methods = sorted({c.method for c in done}, key=lambda m: (m != BASELINE, m))
        keys_by_method = {m: {(c.task, c.length) for c in done if c.method == m} for m in methods}
        shared = set.intersection(*keys_by_method.values()) if methods else set()
        by_key = {(c.method, c.task, c.length): c for c in done}
        tasks = sorted({t for t, _ in shared})
        lengths = sorted({n for _, n in shared})
        summaries = []
        for m in methods:
            used = [by_key[(m, t, n)] for t, n in sorted(shared)]
            summaries.append(
                MethodSummary(
                    method=m,
                    score=_mean([c.score for c in used]),
                    task_scores={t: _mean([c.score for c in used if c.task == t]) for t in tasks},
                    length_scores={n: _mean([c.score for c in used if c.length == n]) for n in lengths},
                    omega_msr=_mean([c.omega_msr for c in used]),
                    omega_esr=_mean([c.omega_esr for c in used]),
                    prefill_seconds=_mean([c.prefill_seconds for c in used]),
                    speedup=None,
                    devices=sorted({c.device for c in used if c.device}),
                    backends=sorted({c.backend for c in used if c.backend}),
                )
            )
        base = next((s for s in summaries if s.method == BASELINE), None)
        if base is not None:
            for s in summaries:
                s.speedup = base.prefill_seconds / s.prefill_seconds if s.prefill_seconds > 0 else math.nan
        frontiers = []
        for axis in AXES:
            if axis == "speedup" and base is None:
                continue
            points = [(getattr(s, axis), s.score) for s in summaries]
            frontiers.append(Frontier(axis, [summaries[i].method for i in pareto_front(points)]))
        reports.append(
            ModelReport(
                model, tasks, lengths, summaries, frontiers,
                excluded=[c for c in done if (c.task, c.length) not in shared],
                failed=[c for c in mine if not c.complete],
            )
        )
    return reports
