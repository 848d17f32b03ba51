"""How sparse can a method go for free: per method and task category, the largest ΩESR among its configurations whose
score stays within δ of full attention.

Design decisions:
- Per (run, model), each method's configurations (a router sweep, gate sparsities, XAttention thresholds) are held
  against that run's and model's ``full`` on the comparison's comparable cells of one task category.
- A configuration stays within δ when the lower end of the 95% paired-bootstrap interval of its score minus full's,
  over the category's matched samples (task, length, sample id), is at least −δ
  (`bootstrap.paired_difference`): the data do not show it more than δ points worse. Of those, the one with the
  largest mean ΩESR is the answer, with its ΩESR's interval (`bootstrap.mean_interval` of its per-sample ΩESR, each
  cell weighing the same) and its score difference's.
- A method none of whose configurations stays within δ gets a row saying so, with its least-degraded configuration's
  difference, so the reader sees how far it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .bootstrap import Difference, Interval, mean_interval, paired_difference
from .summary import BASELINE, Comparison, Config, Key, paired_scores

DELTA = 1.0
"""The default δ, in score points (percent)."""


@dataclass(frozen=True)
class FreeSparsity:
    """The answer for one method and category.

    Attributes:
        method: the method's name, prefixed with its run and model where the comparison holds several.
        category: the task category.
        label: the chosen configuration (None: none stays within δ; ``difference`` is then the least-degraded one's).
        omega_esr: the chosen configuration's mean ΩESR over the category's cells and its 95% interval (None when none
            is chosen).
        difference: score − full's over the matched samples, with its 95% paired-bootstrap interval.
        tried: the method's configurations held against ``full``.
        delta: δ in score points.
    """

    method: str
    category: str
    label: str | None
    omega_esr: Interval | None
    difference: Difference
    tried: int
    delta: float


def free_sparsity(comparison: Comparison, delta: float = DELTA) -> list[FreeSparsity]:
    """For every method of ``comparison`` held against a ``full`` of the same run and model, and every task category
    of the comparable cells, the largest ΩESR within ``delta`` score points of full attention (module doc); [] where
    no configuration has a ``full`` beside it."""
    found = []
    several = len({(c.run, c.model) for c in comparison.configs}) > 1
    categories: dict[str, list[Key]] = {}
    for key in comparison.keys:
        categories.setdefault(comparison.category(key[0]), []).append(key)
    for base in (c for c in comparison.configs if c.method == BASELINE):
        methods: dict[str, list[Config]] = {}
        for config in comparison.configs:
            if (config.run, config.model) == (base.run, base.model) and config.method_name != BASELINE:
                methods.setdefault(config.method_name, []).append(config)
        prefix = " · ".join(p for p in (base.run, base.model) if p) + " · " if several else ""
        for name, configs in methods.items():
            for category, keys in sorted(categories.items()):
                found.append(_best(f"{prefix}{name}", category, configs, base, keys, delta))
    return found


def _best(method: str, category: str, configs: list[Config], base: Config, keys: list[Key],
          delta: float) -> FreeSparsity:
    """The largest-ΩESR configuration of ``configs`` within ``delta`` of ``base`` on the cells ``keys``."""
    tried = []
    for config in configs:
        difference = paired_difference(*paired_scores(config, base, keys))
        esr = mean_interval([np.array([s.omega_esr for s in config.cells[k].samples], dtype=float) for k in keys])
        tried.append((config, difference, esr))
    within = [t for t in tried if t[1].n and t[1].low >= -delta]
    if within:
        config, difference, esr = max(within, key=lambda t: t[2].mean)
        return FreeSparsity(method, category, config.label, esr, difference, len(tried), delta)
    _, difference, _ = max(tried, key=lambda t: t[1].low if t[1].n else -math.inf)
    return FreeSparsity(method, category, None, None, difference, len(tried), delta)
