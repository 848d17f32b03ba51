"""Published figures beside measured ones: the Elastic Attention paper's tables (``data/paper_results.json``, each
figure with its table) matched to a comparison's configurations.

Design decisions:
- A configuration matches a published row when its model, method (Elastic's mode included), settings and cells do:
  - model: the result folder's model name without its organisation (``meta-llama--``) and a leading ``Meta-``,
    compared case-blind (``Llama-3.1-8B-Instruct``);
  - method: ``full``, or the sparse methods run under the preset the figures were measured with (``elastic-paper``)
    with no option of their own beyond the learned files (gates, router) and Elastic's ``mode``, which is the one
    given, else the one the cell ran with (``method_resolved``: the checkpoint's); a cell recording neither matches
    no Elastic row;
  - cells: every task the published figure averages, among the comparison's comparable cells, at the figure's length
    (RULER per length); the RULER average needs all its lengths; LongBench-E and LongBench-v2, whose truncation length
    the paper does not state, match at each length the run has.
- The measured value is the mean of those cells' scores (the RULER average: the mean of the per-length means), as the
  paper averages; the difference is measured − published. Nothing is shown for a configuration that matches nothing.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .labels import folder_options, resolved_options
from .summary import BASELINE, Comparison, Config

DATA = Path(__file__).resolve().parent / "data" / "paper_results.json"
MATCHING_OPTIONS = {"preset", "mode"}  # folder options a matching sparse configuration may record, beside its files


@dataclass(frozen=True)
class Figure:
    """One published score: ``model`` × ``method`` (``mode``: Elastic's, else None) × ``benchmark`` at ``length``
    tokens (None: the benchmark's average over lengths, or a length the paper does not state), with the ΩMSR printed
    beside it (None where none is) and its ``source`` table."""

    model: str
    method: str
    mode: str | None
    benchmark: str
    length: int | None
    score: float
    omega_msr: float | None
    source: str
    note: str = ""


@dataclass(frozen=True)
class Published:
    """A paper's figures: ``preset`` is the settings preset its sparse methods match under; ``tasks`` the tasks each
    benchmark's figures average; ``lengths`` the lengths a benchmark's average (length None) spans, where it has one."""

    paper: str
    preset: str
    tasks: dict[str, tuple[str, ...]]
    lengths: dict[str, tuple[int, ...]]
    figures: tuple[Figure, ...]


@dataclass(frozen=True)
class Match:
    """A published figure beside the configuration ``label``'s measured mean over ``cells`` cells at ``length``
    (None: the average over the figure's lengths)."""

    label: str
    figure: Figure
    length: int | None
    measured: float
    measured_msr: float
    cells: int

    @property
    def difference(self) -> float:
        """Measured − published, in score points."""
        return self.measured - self.figure.score


@cache
def load_published(path: Path = DATA) -> Published:
    """The figures shipped in ``path`` (the package's ``data/paper_results.json``)."""
    data = json.loads(Path(path).read_text())
    benchmarks = data["benchmarks"]
    return Published(
        paper=data["paper"], preset=data["preset"],
        tasks={name: tuple(b["tasks"]) for name, b in benchmarks.items()},
        lengths={name: tuple(b["average_of_lengths"]) for name, b in benchmarks.items() if "average_of_lengths" in b},
        figures=tuple(Figure(**f) for f in data["figures"]),
    )


def model_key(name: str) -> str:
    """A model name as matching compares it: ``meta-llama--Meta-Llama-3.1-8B-Instruct`` → ``llama-3.1-8b-instruct``."""
    last = re.split(r"--|/", name)[-1].lower()
    return last.removeprefix("meta-")


def method_key(config: Config, preset: str) -> tuple[str, str | None] | None:
    """(method, Elastic's mode) of a configuration whose settings are the figures' (``full``, or a sparse method run
    under ``preset`` with no option of its own but learned files and the mode); None otherwise."""
    if config.method_name == BASELINE:
        return (BASELINE, None) if config.method == BASELINE else None
    cells = list(config.cells.values())
    if not cells or any(c.preset != preset for c in cells):
        return None
    recorded = set(folder_options(config.method, config.method_name))
    if recorded - MATCHING_OPTIONS - set(config.artifacts):
        return None
    if config.method_name != "elastic":
        return config.method_name, None
    mode = config.options.get("mode") or resolved_options(cells).get("mode")
    return (config.method_name, mode) if mode else None


def matches(comparison: Comparison, published: Published | None = None) -> list[Match]:
    """Every published figure that a configuration of ``comparison`` matches (module doc), in the order of the
    configurations, then of the figures."""
    published = published or load_published()
    found = []
    for config in comparison.configs:
        key = method_key(config, published.preset)
        if key is None:
            continue
        for figure in published.figures:
            if (figure.method, figure.mode) != key or model_key(figure.model) != model_key(config.model):
                continue
            found += _measured(config, figure, published)
    return found


def _measured(config: Config, figure: Figure, published: Published) -> list[Match]:
    """The matches of ``figure`` in ``config``: at its length, over its lengths (an average), or at each length the
    configuration covers (a figure of no stated length)."""
    tasks = published.tasks[figure.benchmark]
    if figure.length is not None:
        lengths, average = [figure.length], False
    elif figure.benchmark in published.lengths:
        lengths, average = list(published.lengths[figure.benchmark]), True
    else:
        lengths, average = sorted({n for _, n in config.cells}), False
    per_length = {n: [config.cells.get((t, n)) for t in tasks] for n in lengths}
    covered = {n: cells for n, cells in per_length.items() if all(c is not None for c in cells)}
    if average:
        if len(covered) < len(lengths):
            return []
        score = _mean([_mean([c.score for c in cells]) for cells in covered.values()])
        msr = _mean([_mean([c.omega_msr for c in cells]) for cells in covered.values()])
        return [Match(config.label, figure, None, score, msr, sum(map(len, covered.values())))]
    return [Match(config.label, figure, n, _mean([c.score for c in cells]), _mean([c.omega_msr for c in cells]),
                  len(cells)) for n, cells in covered.items()]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan
