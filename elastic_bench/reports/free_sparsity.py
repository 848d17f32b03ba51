"""How sparse can a method go for free: per method and task category, the sparsest of its configurations whose score
stays within δ of full attention, chosen on one half of the items and confirmed on the other.

Design decisions:
- Per (run, model), each method's configurations (a router sweep, gate sparsities, XAttention thresholds) are held
  against that run's and model's ``full`` on the comparison's comparable cells of one task category.
- A configuration stays within δ on a set of items when the lower end of the 95% paired-bootstrap interval of its
  score minus full's over those items' matched samples (task, length, sample id), resampled by item and stratified by
  cell (`summary.difference`), is at least −δ: the data do not show it more than δ points worse.
- Choosing the sparsest of many configurations that pass is a selection: tried on the same items, the best of ``k``
  pure-noise configurations passes far more often than one does (the tests measure how often).
  So the items are split in two halves (`split_items`: by item, every length of an item on one side, alternating
  within each task in the order of a hash of the item): the configuration is chosen on the *selection* half (the
  largest mean ΩESR among those within δ there) and the claim is made only if that one configuration is within δ on
  the held-out *confirmation* half. One test on items the choice never saw: a claim is wrong at most as often as the
  interval's one-sided error, `ERROR_RATE` (Cox, Biometrika 1975, on data splitting; the selection half may be
  spent freely).
- The row shows the chosen configuration, its ΩESR over all the category's cells (`summary.sample_interval`; ΩESR is
  measured, not tested), its confirmation-half difference and whether it is confirmed. A method none of whose
  configurations passes on the selection half gets a row saying so, with its least-degraded configuration's
  selection-half difference.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from .bootstrap import LEVEL, RESAMPLES, Difference, Interval
from .summary import BASELINE, Comparison, Config, Item, Key, difference, mark, sample_interval

DELTA = 1.0
"""The default δ, in score points (percent)."""
ERROR_RATE = (1 - LEVEL) / 2
"""The nominal error rate of a claim "within δ": the chance that the lower end of a 95% interval lies above the true
difference (2.5%)."""
METHOD = ("split by item: the configuration is chosen on one half of the items and confirmed on the other "
          f"(nominal error of a claim {100 * ERROR_RATE:g}%)")
"""The selection method, as the report names it."""


@dataclass(frozen=True)
class FreeSparsity:
    """The answer for one method and category.

    Attributes:
        method: the method's name, prefixed with its run and model where the comparison holds several.
        category: the task category.
        label: the configuration chosen on the selection half (None: none stays within δ there; ``difference`` is then
            the least-degraded one's there).
        omega_esr: the chosen configuration's mean ΩESR over the category's cells and its 95% interval (None when none
            is chosen).
        difference: the chosen configuration's score − full's over the confirmation half's matched samples, with its
            95% paired-bootstrap interval (the selection half's, for the least-degraded one, when none is chosen).
        confirmed: whether the chosen configuration stays within δ on the confirmation half: the claim.
        tried: the method's configurations held against ``full``.
        delta: δ in score points.
        mark: the in-distribution mark of the chosen configuration's cells of the category (`summary.mark`).
    """

    method: str
    category: str
    label: str | None
    omega_esr: Interval | None
    difference: Difference
    confirmed: bool
    tried: int
    delta: float
    mark: str = ""


def split_items(keys: list[Key], base: Config) -> tuple[set[Item], set[Item]]:
    """The items (task, sample id) of ``base``'s samples in the cells ``keys``, split in two halves: within each task,
    in the order of the SHA-256 of the item, alternately to the selection and the confirmation half (every length of
    an item on the same side; halves equal to within one item per task)."""
    by_task: dict[str, set[str]] = {}
    for key in keys:
        by_task.setdefault(key[0], set()).update(s.id for s in base.cells[key].samples)
    halves: tuple[set[Item], set[Item]] = (set(), set())
    for task, ids in by_task.items():
        ordered = sorted(ids, key=lambda i: hashlib.sha256(f"{task}\0{i}".encode()).hexdigest())
        for position, sample in enumerate(ordered):
            halves[position % 2].add((task, sample))
    return halves


def within(found: Difference, delta: float) -> bool:
    """Whether a difference's interval stays above −δ (it has samples and its lower end is at least −δ)."""
    return found.n > 0 and found.low >= -delta


def free_sparsity(comparison: Comparison, delta: float = DELTA, resamples: int = RESAMPLES) -> list[FreeSparsity]:
    """For every method of ``comparison`` held against a ``full`` of the same run and model, and every task category
    of the comparable cells, the sparsest configuration within ``delta`` score points of full attention, chosen on one
    half of the items and confirmed on the other (module doc); [] where no configuration has a ``full`` beside it.
    ``resamples``: bootstrap resamples per interval."""
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
                found.append(_best(f"{prefix}{name}", category, configs, base, keys, delta, resamples))
    return found


def _best(method: str, category: str, configs: list[Config], base: Config, keys: list[Key], delta: float,
          resamples: int) -> FreeSparsity:
    """The configuration of ``configs`` chosen on the selection half of the cells ``keys`` and confirmed (or not) on
    the other half."""
    selection, confirmation = split_items(keys, base)
    tried = [(config, difference(config, base, keys, selection, resamples)) for config in configs]
    passing = [(config, sample_interval(config, "omega_esr", keys, resamples=resamples))
               for config, found in tried if within(found, delta)]
    if passing:
        config, esr = max(passing, key=lambda t: t[1].mean)
        confirmed = difference(config, base, keys, confirmation, resamples)
        return FreeSparsity(method, category, config.label, esr, confirmed, within(confirmed, delta), len(tried),
                            delta, mark(config.cells[k] for k in keys))
    _, least = max(tried, key=lambda t: t[1].low if t[1].n else -math.inf)
    return FreeSparsity(method, category, None, None, least, False, len(tried), delta)
