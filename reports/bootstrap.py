"""Bootstrap intervals of mean scores: how sure is a configuration's mean score (`mean_interval`), and is configuration
A really better than B on the same prompts (`paired_difference`)?

Design decisions:
- Paired: the resampled unit is one prompt scored by both configurations, so the prompt-to-prompt variance that both
  share cancels (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, §14; Koehn, EMNLP 2004).
- Stratified: a mean of cell means (each cell weighs the same, as the report's means do) resamples the prompts within
  each cell, so every resample keeps the cells' weights.
- Percentile interval of ``RESAMPLES`` means of resampled differences, from a generator seeded with ``SEED``: the same
  scores give the same interval on every machine and every run.
- Resampling runs in chunks, so memory stays ``O(chunk × n)`` for tens of thousands of prompts.
"""

from __future__ import annotations

import math
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
    """Mean of ``a − b`` over ``n`` paired samples, and its ``level`` bootstrap interval ``[low, high]`` (NaN when
    no sample is shared)."""

    @property
    def significant(self) -> bool:
        """Whether the interval excludes 0."""
        return self.n > 0 and (self.low > 0 or self.high < 0)


def mean_interval(groups: list[np.ndarray], resamples: int = RESAMPLES, level: float = LEVEL, seed: int = SEED,
                  chunk: int = 256) -> Interval:
    """The mean of the groups' means and its percentile bootstrap interval, resampling within each group.

    Args:
        groups: per-sample scores of each group (e.g. of each cell), float arrays ``[n_g]``; empty groups are left out.
        resamples: bootstrap resamples (with replacement, ``n_g`` samples of each group each).
        level: coverage of the interval (0.95: the 2.5th and 97.5th percentiles).
        seed: the generator's seed (`numpy.random.default_rng`).
        chunk: resamples drawn at once.
    """
    arrays = [np.asarray(g, dtype=float) for g in groups]
    if any(a.ndim != 1 for a in arrays):
        raise ValueError(f"scores must be arrays [n], got shapes {[a.shape for a in arrays]}")
    arrays = [a for a in arrays if a.size]
    if not arrays:
        return Interval(math.nan, math.nan, math.nan, 0, level)
    rng = np.random.default_rng(seed)
    means = np.concatenate([
        np.mean([a[rng.integers(0, a.size, size=(min(chunk, resamples - start), a.size))].mean(axis=1)
                 for a in arrays], axis=0)
        for start in range(0, resamples, chunk)])
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(np.mean([a.mean() for a in arrays])), float(low), float(high), sum(a.size for a in arrays),
                    level)


def paired_difference(a: np.ndarray, b: np.ndarray, resamples: int = RESAMPLES, level: float = LEVEL,
                      seed: int = SEED, chunk: int = 256) -> Difference:
    """The mean difference ``a − b`` of paired scores and its percentile bootstrap interval.

    Args:
        a, b: scores of the same samples under two configurations, float arrays ``[n]`` (sample ``i`` of ``a`` is
            sample ``i`` of ``b``).
        resamples: bootstrap resamples (with replacement, ``n`` samples each).
        level: coverage of the interval (0.95: the 2.5th and 97.5th percentiles).
        seed: the generator's seed (`numpy.random.default_rng`).
        chunk: resamples drawn at once.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired scores must be two arrays [n] of one length, got {a.shape} and {b.shape}")
    found = mean_interval([a - b], resamples, level, seed, chunk)
    return Difference(found.mean, found.low, found.high, found.n, level)
