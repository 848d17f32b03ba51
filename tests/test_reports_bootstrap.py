"""The bootstraps of `elastic_bench.reports.bootstrap`: their 95% intervals cover known differences and means, an item
repeated across lengths is resampled as one, and Holm's adjustment is the textbook one."""

from __future__ import annotations

import numpy as np
import pytest

from elastic_bench.reports import paired_difference
from elastic_bench.reports.bootstrap import clustered_interval, holm, mean_interval


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
    assert d.low > 0 and d.p_value < 0.05 and d.high - d.low < 1.0  # unpaired, the prompts' spread would swamp it
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


def test_an_item_repeated_at_every_length_is_one_cluster_and_cells_keep_their_weights():
    rng = np.random.default_rng(4)
    item = rng.normal(0, 10, 60)  # one value per item, the same at each of 4 lengths (perfectly dependent)
    values = np.tile(item, 4)
    cells = [n for n in range(4) for _ in range(60)]
    ids = list(range(60)) * 4
    alone = clustered_interval(item)
    clustered = clustered_interval(values, cells, ids)
    naive = clustered_interval(values, cells)  # every sample its own cluster: 240 "independent" samples
    assert clustered.mean == pytest.approx(alone.mean) and clustered.n == 240
    # four copies of the same items carry the information of one: the clustered interval is as wide as one length's,
    # the naive one about half as wide
    assert clustered.high - clustered.low == pytest.approx(alone.high - alone.low, rel=0.1)
    assert naive.high - naive.low < 0.6 * (clustered.high - clustered.low)
    weighted = clustered_interval(np.array([1.0, 1.0, 4.0]), ["a", "a", "b"], weights={"a": 3, "b": 1})
    assert weighted.mean == pytest.approx((3 * 1.0 + 4.0) / 4)


def test_holm_adjusts_a_family_of_p_values_step_down():
    # sorted 0.01, 0.02, 0.03, 0.5 of 4: 4·0.01, max(that, 3·0.02), max(that, 2·0.03), max(that, 0.5)
    assert holm([0.03, 0.01, 0.5, 0.02]) == pytest.approx([0.06, 0.04, 0.5, 0.06])
    assert holm([0.4, 0.9]) == pytest.approx([0.8, 0.9]) and holm([]) == []
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])  # capped at 1


def test_the_p_value_agrees_with_the_interval():
    rng = np.random.default_rng(5)
    for shift in (0.0, 0.5, 1.0, 3.0):
        d = paired_difference(rng.normal(shift, 3, 80), np.zeros(80))
        assert (d.p_value < 0.05) == (d.low > 0 or d.high < 0)
