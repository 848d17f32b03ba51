"""Published figures beside measured ones: the Elastic Attention paper's tables (``data/paper_results.json``, each
figure with its table) matched to a comparison's configurations, under the protocol the figures were computed with.

Design decisions:
- The figures carry their protocol (``paper``, `elastic_bench.results.protocols`): a measured value is computed under
  that protocol (its task set, its weights, its lengths) from the configuration's cells, whatever protocol the rest of
  the report follows, so a figure is only ever matched by a value of its own protocol.
- A configuration matches a published row when its model, method (Elastic's mode included), settings and cells do:
  - model: the result folder's model name without its organisation (``meta-llama--``) and a leading ``Meta-``,
    compared case-blind (``Llama-3.1-8B-Instruct``);
  - method: ``full``, or the sparse methods run under the preset the figures were measured with (``elastic-paper``)
    with no option of their own beyond the learned files (gates, router) and Elastic's ``mode``, which is the one
    given, else the one the cell ran with (``method_resolved``: the checkpoint's); a cell recording neither matches
    no Elastic row;
  - cells: a task's figure (LongBench-E's per-task columns) needs that task's cell; a benchmark's figure every task of
    the protocol's task set, at the figure's length (RULER per length); the RULER average needs all the protocol's
    lengths; LongBench-E and LongBench-v2, whose truncation length the paper does not state, match at each length the
    run has. A sub-score figure (LongBench-v2 Easy / Hard) is matched by the cell's official sub-score.
- The measured value is the protocol's mean of those cells' scores (the RULER average: the mean of the per-length
  means; LongBench-E: the sample-weighted mean of its tasks); the difference is measured − published.
- Where a printed average is not the one its own printed columns give under the protocol (the paper's RULER "Avg" is
  not the mean of its six lengths on most rows), the match carries both (`Match.recomputed`), and the table shows both.
- Where the protocol's item subset cannot be identified from public data (the paper's 416 LongBench-v2 items), the
  match says so (`Match.items`) rather than compare with the run's items silently.
- A match is a *reproduction* only when every learned file of the configuration was trained with the paper's recipe
  (`summary.Config.kind`); otherwise it is a *comparison*, with the reason.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from elastic_bench.results.protocols import Protocol, get_protocol, reproduces

from .labels import folder_options, resolved_options
from .summary import BASELINE, Comparison, Config, mark

DATA = Path(__file__).resolve().parent / "data" / "paper_results.json"
MATCHING_OPTIONS = {"preset", "mode"}  # folder options a matching sparse configuration may record, beside its files


@dataclass(frozen=True)
class Figure:
    """One published score: ``model`` × ``method`` (``mode``: Elastic's, else None) × ``benchmark`` — the whole
    benchmark, or one ``task`` of it, or one official sub-score ``breakdown`` (``"easy"``) — at ``length`` tokens
    (None: the benchmark's average over lengths, or a length the paper does not state), with the ΩMSR printed beside
    it (None where none is) and its ``source`` table."""

    model: str
    method: str
    mode: str | None
    benchmark: str
    length: int | None
    score: float
    omega_msr: float | None
    source: str
    task: str | None = None
    breakdown: str | None = None
    note: str = ""

    @property
    def row(self) -> tuple[str, str, str | None, str]:
        """The printed row and benchmark the figure belongs to: (model, method, mode, benchmark)."""
        return self.model, self.method, self.mode, self.benchmark

    @property
    def name(self) -> str:
        """What the figure is of: ``RULER``, ``LongBench-E · longbench_e_qasper``, ``LongBench-v2 · easy``."""
        return " · ".join(p for p in (self.benchmark, self.task if self.breakdown is None else None, self.breakdown)
                          if p)


@dataclass(frozen=True)
class Published:
    """A paper's figures: ``preset`` is the settings preset its sparse methods match under, ``protocol`` the one its
    figures were computed with."""

    paper: str
    preset: str
    protocol: Protocol
    figures: tuple[Figure, ...]

    def recomputed(self, figure: Figure) -> float:
        """A benchmark's printed average recomputed under the protocol from the same row's printed columns: the mean
        of its per-length figures (RULER), the weighted mean of its per-task figures (LongBench-E) or of its
        sub-scores (LongBench-v2); NaN for a figure that is no such average or whose columns are not all printed."""
        if figure.task is not None or figure.length is not None:
            return math.nan
        bench = self.protocol.benchmark(figure.benchmark)
        row = [f for f in self.figures if f.row == figure.row and f is not figure]
        if bench.lengths:
            per_length = {f.length: f.score for f in row if f.task is None and f.breakdown is None}
            if all(n in per_length for n in bench.lengths):
                return sum(per_length[n] for n in bench.lengths) / len(bench.lengths)
        if bench.breakdown_weights:
            return bench.breakdown_mean({f.breakdown: f.score for f in row if f.breakdown is not None})
        per_task = {f.task: f.score for f in row if f.task is not None and f.breakdown is None}
        if bench.tasks is not None and per_task and all(t in per_task for t in bench.tasks):
            return bench.task_mean(per_task)
        return math.nan


@dataclass(frozen=True)
class Match:
    """A published figure beside the configuration ``label``'s measured value over ``cells`` cells at ``length``
    (None: the average over the figure's lengths), computed under the figure's ``protocol``.

    ``kind`` is ``"reproduction"`` or ``"comparison"`` and ``why`` says why a comparison is one (`Config.kind`);
    ``recomputed`` is the published average recomputed from its printed columns (NaN where the figure is no such
    average); ``items`` says how the protocol's items differ from the run's where they cannot be identified ("");
    ``mark`` is the cells' in-distribution mark (`summary.mark`).
    """

    label: str
    figure: Figure
    length: int | None
    measured: float
    measured_msr: float
    cells: int
    protocol: str
    kind: str = "reproduction"
    why: str = ""
    recomputed: float = math.nan
    items: str = ""
    mark: str = ""

    @property
    def difference(self) -> float:
        """Measured − published, in score points."""
        return self.measured - self.figure.score

    @property
    def shows_both(self) -> bool:
        """Whether the printed average is not the one its printed columns give (both are then shown)."""
        return math.isfinite(self.recomputed) and not reproduces(self.figure.score, self.recomputed)


@cache
def load_published(path: Path = DATA) -> Published:
    """The figures shipped in ``path`` (the package's ``data/paper_results.json``)."""
    data = json.loads(Path(path).read_text())
    return Published(paper=data["paper"], preset=data["preset"], protocol=get_protocol(data["protocol"]),
                     figures=tuple(Figure(**f) for f in data["figures"]))


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
    """The matches of ``figure`` in ``config``: at its length, over the protocol's lengths (an average), or at each
    length the configuration covers (a figure of no stated length)."""
    bench = published.protocol.benchmark(figure.benchmark)
    tasks = [figure.task] if figure.task is not None else list(bench.tasks or ())
    if figure.length is not None:
        lengths, average = [figure.length], False
    elif bench.lengths and figure.task is None:
        lengths, average = list(bench.lengths), True
    else:
        lengths, average = sorted({n for _, n in config.cells}), False
    per_length = {n: [config.cells.get((t, n)) for t in tasks] for n in lengths}
    covered = {n: cells for n, cells in per_length.items()
               if cells and all(c is not None and (figure.breakdown is None or figure.breakdown in c.breakdown)
                                for c in cells)}

    def score(cells) -> float:
        values = {c.task: (c.breakdown.get(figure.breakdown, math.nan) if figure.breakdown else c.score)
                  for c in cells}
        return bench.task_mean(values)

    def msr(cells) -> float:
        return bench.task_mean({c.task: c.omega_msr for c in cells})

    def items(cells) -> str:
        if bench.items_identified:
            return ""
        return (f"the paper's items: {bench.items}, not identifiable from public data; measured over the run's "
                f"{sum(c.num_samples for c in cells)}")

    kind, why = config.kind
    common = dict(protocol=published.protocol.name, kind=kind, why=why, recomputed=published.recomputed(figure))
    if average:
        if len(covered) < len(lengths):
            return []
        used = [c for cells in covered.values() for c in cells]
        return [Match(config.label, figure, None, _mean([score(cells) for cells in covered.values()]),
                      _mean([msr(cells) for cells in covered.values()]), len(used), items=items(used),
                      mark=mark(used), **common)]
    return [Match(config.label, figure, n, score(cells), msr(cells), len(cells), items=items(cells), mark=mark(cells),
                  **common) for n, cells in covered.items()]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan
