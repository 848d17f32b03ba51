"""Paired bootstrap of a difference of mean scores: is configuration A really better than B on the same prompts?

Design decisions:
- Paired: the resampled unit is one prompt scored by both configurations, so the prompt-to-prompt variance that both
  share cancels (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, §14; Koehn, EMNLP 2004).
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
class Difference:
    """Mean of ``a − b`` over ``n`` paired samples, and its ``level`` bootstrap interval ``[low, high]`` (NaN when
    no sample is shared)."""

    mean: float
    low: float
    high: float
    n: int
    level: float = LEVEL

    @property
    def significant(self) -> bool:
        """Whether the interval excludes 0."""
        return self.n > 0 and (self.low > 0 or self.high < 0)


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
    n = a.shape[0]
    if n == 0:
        return Difference(math.nan, math.nan, math.nan, 0, level)
    diff = a - b
    rng = np.random.default_rng(seed)
    means = np.concatenate([diff[rng.integers(0, n, size=(min(chunk, resamples - start), n))].mean(axis=1)
                            for start in range(0, resamples, chunk)])
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return Difference(float(diff.mean()), float(low), float(high), n, level)
