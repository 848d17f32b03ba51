"""The bootstraps of `elastic_bench.reports.bootstrap`: their 95% intervals cover known differences and means."""

from __future__ import annotations

import numpy as np
import pytest

from elastic_bench.reports import paired_difference
from elastic_bench.reports.bootstrap import mean_interval


def test_the_interval_covers_the_true_difference_in_at_least_93_percent_of_200_simulations():
    rng = np.random.default_rng(1)
    true, n = 3.0, 200
    covered = 0
    for _ in range(200):
        prompt = rng.normal(50, 20, n)  # what both configurations share: how hard each prompt is
        a = prompt + true + rng.normal(0, 10, n)
        b = prompt + rng.normal(0, 10, n)
        d = paired_difference(a, b)
        covered += d.low <= true <= d.high
    assert covered >= 186


def test_pairing_cancels_the_shared_variance_and_the_seed_fixes_the_interval():
    rng = np.random.default_rng(2)
    prompt = rng.normal(50, 30, 100)
    a, b = prompt + 1.0 + rng.normal(0, 1, 100), prompt + rng.normal(0, 1, 100)
    d = paired_difference(a, b)
    assert d.significant and d.high - d.low < 1.0  # unpaired, the prompts' spread (30) would swamp a 1-point gain
    assert paired_difference(a, b) == d  # same scores, same interval
    assert paired_difference(a, a).low == paired_difference(a, a).high == 0.0
    assert paired_difference(np.array([]), np.array([])).n == 0
    with pytest.raises(ValueError, match="one length"):
        paired_difference(a, b[:-1])


def test_the_interval_of_a_mean_of_cell_means_weighs_cells_alike_and_covers_the_true_mean():
    found = mean_interval([np.full(4, 100.0), np.zeros(100), np.array([])])  # an empty cell is left out
    assert (found.mean, found.low, found.high, found.n) == (50.0, 50.0, 50.0, 104)  # cells, not samples, weigh alike
    assert mean_interval([]).n == 0
    rng = np.random.default_rng(3)
    covered = 0
    for _ in range(200):
        cells = [rng.normal(60, 15, 40), rng.normal(80, 5, 10)]  # true mean of the cell means: 70
        interval = mean_interval(cells)
        covered += interval.low <= 70 <= interval.high
    assert covered >= 180
