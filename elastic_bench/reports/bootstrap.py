"""Bootstrap intervals of mean scores: how sure is a configuration's mean score (`mean_interval`), is configuration A
really better than B on the same prompts (`paired_difference`), and which of many such differences survive a
family-wise correction (`holm`)?

Design decisions:
- Paired: the resampled unit is one prompt scored by both configurations, so the prompt-to-prompt variance that both
  share cancels (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, §14; Koehn, EMNLP 2004).
- Clustered: the same underlying item scored in several cells (a RULER sample id at every length, a LongBench record
  at every truncation length) is one cluster, resampled as a whole: its scores at the different lengths are not
  independent draws (Field & Welsh, JRSS B 2007, the cluster bootstrap). Without cluster labels every sample is its
  own cluster.
- Stratified by cell: the estimate is a mean of cell means (each cell weighs the same, or as given), and the clusters
  of each stratum (the cells that share clusters, e.g. one task's lengths) are resampled within it, so every resample
  keeps the cells and their weights.
- Percentile interval of ``RESAMPLES`` resampled means, from a generator seeded with ``SEED``: the same scores give
  the same interval on every machine and every run. The p-value of "the mean is 0" is the bootstrap's two-sided
  percentile p-value, ``2 · min(P*(mean ≤ 0), P*(mean ≥ 0))`` with the add-one rule (Davison & Hinkley 1997, §4.4),
  the one under which the percentile interval excludes 0 exactly when p < 1 − level.
- A resample draws each stratum's clusters as multinomial counts and sums cluster totals by a matrix product, so it
  costs ``O(chunk × clusters × cells)`` memory and no Python loop per resample.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

SEED = 20240601
RESAMPLES = 4000
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` samples and its ``level`` bootstrap interval ``[low, high]`` (all NaN without samples)."""

    mean: float
    low: float
    high: float
    n: int
    level: float = LEVEL


@dataclass(frozen=True)
class Difference(Interval):
    """Mean of ``a − b`` over ``n`` paired samples, its ``level`` bootstrap interval ``[low, high]`` (NaN when no
    sample is shared) and the bootstrap p-value of "the difference is 0" (1 without samples)."""

    p_value: float = 1.0


def _strata(cells: list[int], clusters: list[int]) -> list[tuple[list[int], list[int]]]:
    """The strata of a sample set: groups of cells joined by shared clusters, each as (its cells, its clusters), in
    the order of their first sample."""
    parent = list(range(max(cells) + 1))

    def root(c: int) -> int:
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    first_cell: dict[int, int] = {}
    for cell, cluster in zip(cells, clusters):
        other = first_cell.setdefault(cluster, cell)
        parent[root(cell)] = root(other)
    found: dict[int, tuple[list[int], list[int]]] = {}
    for cell, cluster in zip(cells, clusters):
        members, names = found.setdefault(root(cell), ([], []))
        if cell not in members:
            members.append(cell)
        if cluster not in names:
            names.append(cluster)
    return list(found.values())


def _codes(labels: Sequence[Hashable]) -> list[int]:
    seen: dict[Hashable, int] = {}
    return [seen.setdefault(label, len(seen)) for label in labels]


def _bootstrap(values: np.ndarray, cells: Sequence[Hashable], clusters: Sequence[Hashable],
               weights: Mapping[Hashable, float] | None, resamples: int, seed: int,
               chunk: int) -> tuple[float, np.ndarray]:
    """The weighted mean of the cell means of ``values`` and ``resamples`` of it, each stratum's clusters drawn with
    replacement (module doc)."""
    cell_codes, cluster_codes = _codes(cells), _codes(clusters)
    names = list(dict.fromkeys(cells))
    w = np.array([1.0 if weights is None else float(weights[name]) for name in names])
    sums = np.zeros((max(cluster_codes) + 1, len(names)))
    counts = np.zeros_like(sums)
    np.add.at(sums, (cluster_codes, cell_codes), values)
    np.add.at(counts, (cluster_codes, cell_codes), 1.0)
    point = float(np.sum(w * sums.sum(0) / counts.sum(0)) / w.sum())
    rng = np.random.default_rng(seed)
    strata = _strata(cell_codes, cluster_codes)
    means = []
    for start in range(0, resamples, chunk):
        rows = min(chunk, resamples - start)
        cell_sums, cell_counts = np.empty((rows, len(names))), np.empty((rows, len(names)))
        for members, drawn in strata:
            draws = rng.multinomial(len(drawn), np.full(len(drawn), 1 / len(drawn)), size=rows)  # [rows, clusters]
            cell_sums[:, members] = draws @ sums[np.ix_(drawn, members)]
            cell_counts[:, members] = draws @ counts[np.ix_(drawn, members)]
        kept = cell_counts > 0  # a resample may draw none of a cell's clusters: the cell is left out of it
        cell_means = np.where(kept, cell_sums, 0.0) / np.maximum(cell_counts, 1.0)
        means.append(cell_means @ w / (kept @ w))  # NaN values (a sparsity a cell does not record) stay NaN
    return point, np.concatenate(means)


def clustered_interval(values: np.ndarray, cells: Sequence[Hashable] | None = None,
                       clusters: Sequence[Hashable] | None = None, weights: Mapping[Hashable, float] | None = None,
                       resamples: int = RESAMPLES, level: float = LEVEL, seed: int = SEED,
                       chunk: int = 256) -> Difference:
    """The (weighted) mean of cell means of ``values`` and its percentile cluster-bootstrap interval, stratified by
    cell, with the p-value of "the mean is 0".

    Args:
        values: per-sample values, a float array ``[n]``.
        cells: each sample's cell (any hashable, e.g. ``(task, length)``), length ``n``; None: one cell.
        clusters: each sample's cluster, the underlying item (e.g. ``(task, sample id)``), length ``n``; a cluster
            shared by several cells joins them into one stratum, resampled together. None: every sample its own.
        weights: cell → its weight in the mean of cell means; None: the cells weigh the same.
        resamples: bootstrap resamples.
        level: coverage of the interval (0.95: the 2.5th and 97.5th percentiles).
        seed: the generator's seed (`numpy.random.default_rng`).
        chunk: resamples drawn at once.
    """
    values = np.asarray(values, dtype=float)
    if values.ndim != 1:
        raise ValueError(f"values must be an array [n], got shape {values.shape}")
    n = values.size
    cells = [0] * n if cells is None else list(cells)
    clusters = list(range(n)) if clusters is None else list(clusters)
    if len(cells) != n or len(clusters) != n:
        raise ValueError(f"one cell and one cluster per value: {n} values, {len(cells)} cells, "
                         f"{len(clusters)} clusters")
    if not n:
        return Difference(math.nan, math.nan, math.nan, 0, level)
    point, means = _bootstrap(values, cells, clusters, weights, resamples, seed, chunk)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    below, above = (np.sum(means <= 0) + 1) / (means.size + 1), (np.sum(means >= 0) + 1) / (means.size + 1)
    return Difference(point, float(low), float(high), n, level, min(1.0, 2 * float(min(below, above))))


def mean_interval(groups: list[np.ndarray], resamples: int = RESAMPLES, level: float = LEVEL, seed: int = SEED,
                  chunk: int = 256) -> Interval:
    """The mean of the groups' means and its percentile bootstrap interval, resampling within each group (each
    sample its own cluster: `clustered_interval` for samples that repeat across groups).

    Args:
        groups: per-sample scores of each group (e.g. of each cell), float arrays ``[n_g]``; empty groups are left out.
        resamples, level, seed, chunk: as `clustered_interval`.
    """
    arrays = [np.asarray(g, dtype=float) for g in groups]
    if any(a.ndim != 1 for a in arrays):
        raise ValueError(f"scores must be arrays [n], got shapes {[a.shape for a in arrays]}")
    values = np.concatenate(arrays) if arrays else np.zeros(0)
    cells = [i for i, a in enumerate(arrays) for _ in range(a.size)]
    found = clustered_interval(values, cells, None, None, resamples, level, seed, chunk)
    return Interval(found.mean, found.low, found.high, found.n, level)


def paired_difference(a: np.ndarray, b: np.ndarray, cells: Sequence[Hashable] | None = None,
                      clusters: Sequence[Hashable] | None = None, resamples: int = RESAMPLES, level: float = LEVEL,
                      seed: int = SEED, chunk: int = 256) -> Difference:
    """The mean difference ``a − b`` of paired scores (a mean of cell means) and its percentile cluster-bootstrap
    interval and p-value (`clustered_interval`).

    Args:
        a, b: scores of the same samples under two configurations, float arrays ``[n]`` (sample ``i`` of ``a`` is
            sample ``i`` of ``b``).
        cells, clusters: each sample's cell and underlying item (`clustered_interval`); None: one cell, every sample
            its own cluster.
        resamples, level, seed, chunk: as `clustered_interval`.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired scores must be two arrays [n] of one length, got {a.shape} and {b.shape}")
    return clustered_interval(a - b, cells, clusters, None, resamples, level, seed, chunk)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (Holm, Scand. J. Statistics 1979): rejecting every
    hypothesis whose adjusted p-value is below α keeps the family-wise error rate at α, whatever their dependence.

    Returns the adjusted p-values in the order given: the ``i``-th smallest p becomes ``max_{j≤i} (m − j + 1) p_(j)``,
    capped at 1.
    """
    m = len(p_values)
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
