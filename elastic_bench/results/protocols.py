"""Benchmark protocols as data: what a benchmark's figures average and how, declared once per protocol.

A protocol (`Protocol`) names, per benchmark (`BenchmarkProtocol`): the task set, the item subset, how a task's score
is formed, how the tasks combine into the benchmark's score (equal or sample-weighted, with the weights), the length
buckets its average spans and how an "Avg" is formed. Two are declared:

- ``official``: each benchmark as its official code scores it and its README averages it: every task of the benchmark
  that the harness registers (the official task set), every item, the equal mean of the tasks, an Avg over the run's
  lengths.
- ``paper``: the Elastic Attention paper (arXiv 2601.17367), as its own tables are computed (checked against them in
  the tests): RULER over 11 tasks (Table 9: no vt, no cwe) at 8K-256K, 50 samples per task and length; LongBench-E's
  Avg the sample-weighted mean of its 13 tasks (Table 7); LongBench-v2's Easy / Hard over 150 / 266 items (Table 10).
  A benchmark the paper does not report falls back to ``official``.

Per-task scores are the official scorers' in both protocols (``Task.aggregate``): the protocols differ only in what
they average and how, so a cell's score is the same under either. The reports (`elastic_bench.reports`) read the
protocols for their tables, the published figures they match and ``compare``; this module imports nothing of the
project, so any layer may read it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

RULER_PAPER_LENGTHS = (8192, 16384, 32768, 65536, 131072, 262144)
"""The lengths the paper's RULER Avg spans (Table 9: 8K-256K)."""

ROUNDING = 0.01
"""How far a printed average may lie from the one recomputed from its printed columns and still count as reproduced:
each printed value is rounded to 2 decimals (±0.005), so their weighted mean and the printed Avg differ by at most
0.01 when the Avg was computed from the unrounded columns."""


@dataclass(frozen=True)
class BenchmarkProtocol:
    """How one protocol reads one benchmark.

    Attributes:
        benchmark: the benchmark's name (``RULER``, ``LongBench-E``, ``LongBench-v2``, ``LongBench``, ...).
        tasks: the task set (registered task names); None: every task of the benchmark the harness registers.
        items: the item subset, in words ("every item", "50 per task and length", ...).
        items_identified: whether that subset can be rebuilt from public data; where not, a table comparing with it
            says so.
        task_score: how one task's score is formed from its items.
        task_weights: the weight of each task in the benchmark's score (the items the paper scored per task); None:
            the tasks weigh equally.
        lengths: the length buckets the benchmark's Avg spans (RULER: one column per length); (): the run's lengths.
        breakdown_weights: the items behind each official sub-score the Avg is formed from (LongBench-v2 Easy /
            Hard), {} where the Avg is not formed from sub-scores.
        average: how the benchmark's "Avg" is formed, in words.
        source: where the declaration comes from.
    """

    benchmark: str
    tasks: tuple[str, ...] | None = None
    items: str = "every item"
    items_identified: bool = True
    task_score: str = "the task's official scorer: the mean over its items, in percent"
    task_weights: Mapping[str, float] | None = None
    lengths: tuple[int, ...] = ()
    breakdown_weights: Mapping[str, float] = field(default_factory=dict)
    average: str = "the equal mean of its tasks at each length, then the mean over the lengths"
    source: str = ""

    def includes(self, task: str) -> bool:
        """Whether ``task`` belongs to the protocol's task set."""
        return self.tasks is None or task in self.tasks

    def weight(self, task: str) -> float:
        """The weight of ``task`` in the benchmark's score (1 where the tasks weigh equally)."""
        if self.task_weights is None:
            return 1.0
        return float(self.task_weights[task])

    def task_mean(self, scores: Mapping[str, float]) -> float:
        """The benchmark's score from its tasks' ``scores`` (task → score; NaN scores left out): their equal or
        weighted mean (NaN when none is given)."""
        kept = {task: s for task, s in scores.items() if not math.isnan(s)}
        total = sum(self.weight(task) for task in kept)
        return sum(self.weight(task) * s for task, s in kept.items()) / total if total else math.nan

    def breakdown_mean(self, scores: Mapping[str, float]) -> float:
        """The Avg formed from official sub-scores (``{"easy": x, "hard": y}``) weighted by `breakdown_weights`; NaN
        when a sub-score is missing or the benchmark forms no Avg from sub-scores."""
        if not self.breakdown_weights or any(k not in scores for k in self.breakdown_weights):
            return math.nan
        total = sum(self.breakdown_weights.values())
        return sum(w * scores[k] for k, w in self.breakdown_weights.items()) / total

    def describe(self) -> str:
        """One sentence: task set, weights, per-task score, items, lengths, Avg and source."""
        tasks = ("every registered task" if self.tasks is None else
                 f"{len(self.tasks)} task{'s' if len(self.tasks) > 1 else ''} ({', '.join(self.tasks)})")
        weights = "equal weights" if self.task_weights is None else "tasks weighted by their items (" + ", ".join(
            f"{t.split('_', 2)[-1]} {w:g}" for t, w in self.task_weights.items()) + ")"
        lengths = f"; lengths {', '.join(f'{n // 1024}K' for n in self.lengths)}" if self.lengths else ""
        subset = "" if self.items_identified else " (not identifiable from public data)"
        source = f" [{self.source}]" if self.source else ""
        return (f"{self.benchmark}: {tasks}, {weights}; per task: {self.task_score}; items: {self.items}{subset}"
                f"{lengths}; Avg: {self.average}{source}")


@dataclass(frozen=True)
class Protocol:
    """A named protocol: one `BenchmarkProtocol` per benchmark it declares (others read as ``official``'s)."""

    name: str
    title: str
    benchmarks: Mapping[str, BenchmarkProtocol]

    def benchmark(self, name: str) -> BenchmarkProtocol:
        """The declaration of benchmark ``name``: this protocol's, else the official one's, else every task weighed
        equally (a benchmark nobody declares)."""
        for protocol in (self, PROTOCOLS["official"]):
            if name in protocol.benchmarks:
                return protocol.benchmarks[name]
        return BenchmarkProtocol(name)

    def describe(self) -> str:
        """The protocol in one paragraph: its title, then each benchmark it declares."""
        return f"Protocol `{self.name}` ({self.title}). " + " ".join(
            b.describe() + "." for b in self.benchmarks.values())


_RULER_NIAH = tuple(f"ruler_niah_{kind}_{i}" for kind in ("single", "multikey") for i in (1, 2, 3)) + (
    "ruler_niah_multivalue", "ruler_niah_multiquery")
LONGBENCH_E_ITEMS = {
    "longbench_e_multifieldqa_en": 150, "longbench_e_qasper": 224, "longbench_e_hotpotqa": 300,
    "longbench_e_2wikimqa": 300, "longbench_e_gov_report": 300, "longbench_e_multi_news": 294,
    "longbench_e_trec": 300, "longbench_e_triviaqa": 300, "longbench_e_samsum": 300, "longbench_e_passage_count": 300,
    "longbench_e_passage_retrieval_en": 300, "longbench_e_lcc": 300, "longbench_e_repobench-p": 300,
}
"""The items of each LongBench-E task (``THUDM/LongBench``'s ``*_e`` files): the weights of the paper's Avg."""
LONGBENCH_V2_PAPER_ITEMS = {"easy": 150, "hard": 266}
"""The items behind the paper's LongBench-v2 Easy / Hard figures (all but five are exact fractions of these; the
shipped figures' notes name the five)."""

OFFICIAL = Protocol("official", "each benchmark as its official code scores it and its README averages it", {
    "RULER": BenchmarkProtocol(
        "RULER", items="every generated item (the official default: 500 per task and length)",
        source="NVIDIA/RULER README: per length the unweighted mean over the tasks; Avg the mean over the lengths"),
    "LongBench-E": BenchmarkProtocol(
        "LongBench-E", average="the equal mean of its tasks (the official code forms no overall average)",
        source="THUDM/LongBench eval.py: per-task scores and 0-4k / 4-8k / 8k+ buckets"),
    "LongBench": BenchmarkProtocol(
        "LongBench", average="the equal mean of its tasks", source="THUDM/LongBench README"),
    "LongBench-v2": BenchmarkProtocol(
        "LongBench-v2", average="the mean over its items (result.py's overall)",
        source="THUDM/LongBench result.py: overall, easy, hard, short, medium, long over all 503 items"),
})

PAPER = Protocol("paper", "the Elastic Attention paper's tables, arXiv 2601.17367", {
    "RULER": BenchmarkProtocol(
        "RULER", tasks=(*_RULER_NIAH, "ruler_qa_1", "ruler_qa_2", "ruler_fwe"),
        items="50 per task and length (`run --limit 50`; the paper's own samples come from its seed and tokenizer "
              "and are not published)", items_identified=False, lengths=RULER_PAPER_LENGTHS,
        average="the mean of the six per-length means; the paper's printed Avg is not always that mean (tables show "
                "both where it is not)",
        source="Table 9 (11 tasks: no vt, no cwe; 50 samples; 8K-256K), Tables 2 and 10"),
    "LongBench-E": BenchmarkProtocol(
        "LongBench-E", tasks=tuple(LONGBENCH_E_ITEMS), task_weights=LONGBENCH_E_ITEMS,
        average="the mean of its 13 tasks weighted by their items (reproduces Table 7's Avg to 0.01)",
        source="Tables 1, 7 and 8"),
    "LongBench-v2": BenchmarkProtocol(
        "LongBench-v2", tasks=("longbench_v2",),
        items="416 of the 503 items (150 easy, 266 hard: all but 5 of the 42 Easy / Hard figures printed for the "
              "methods here are exact fractions of these)",
        items_identified=False, breakdown_weights=LONGBENCH_V2_PAPER_ITEMS,
        average="the mean over its items: Easy and Hard weighted 150 : 266",
        source="Tables 2 and 10"),
})

PROTOCOLS = {p.name: p for p in (OFFICIAL, PAPER)}


def get_protocol(name: str) -> Protocol:
    """The protocol named ``name``.

    Raises:
        ValueError: no protocol has that name (the message lists them).
    """
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}; valid: {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]


def reproduces(printed: float, recomputed: float) -> bool:
    """Whether a printed average is the one recomputed from its printed columns, within `ROUNDING`."""
    return math.isfinite(recomputed) and abs(printed - recomputed) <= ROUNDING + 1e-9
