"""Which benchmark a task belongs to, and how each benchmark is read: its task categories and its breakdown.

Design decisions:
- A task's benchmark comes from its registered name (``ruler_*``, ``ruler2_*``, ``longbench_e_*``, ``longbench_v2*``,
  ``longbench_pro``, ``longbench_*``, ``testbed_*``, ``nolima*``, ``babilong_*``, ``mrcr_*``, ``graphwalks_*``,
  ``helmet_*``); any other task is a benchmark of its own. The benchmarks of 2026 are read per length, their tasks'
  categories (sensitive / robust) coming from their samples' ``metadata.category``.
- Categories follow the benchmarks' papers: RULER's four families (retrieval, multi-hop tracing, aggregation, QA;
  arXiv 2404.06654 §3), LongBench's six task types (arXiv 2308.14508 Table 1). A sample's own ``metadata.category``
  (the testbed's ``sensitive`` / ``robust``, the router's training categories) wins over them.
- Breakdown columns are the benchmark's official sub-scores: RULER per length (the table of its paper), LongBench-E
  per length bucket and LongBench-v2 per difficulty and length (``score_<name>`` of ``metrics.json``, as the
  official scripts compute them), LongBench and the testbed per category.
"""

from __future__ import annotations

from dataclasses import dataclass

RULER_FAMILIES = {"niah": "retrieval (NIAH)", "vt": "multi-hop tracing (VT)", "cwe": "aggregation (CWE/FWE)",
                  "fwe": "aggregation (CWE/FWE)", "qa": "question answering (QA)"}
LONGBENCH_TYPES = {
    "single-document QA": ("narrativeqa", "qasper", "multifieldqa_en", "multifieldqa_zh"),
    "multi-document QA": ("hotpotqa", "2wikimqa", "musique", "dureader"),
    "summarization": ("gov_report", "qmsum", "multi_news", "vcsum"),
    "few-shot learning": ("trec", "triviaqa", "samsum", "lsht"),
    "synthetic": ("passage_count", "passage_retrieval_en", "passage_retrieval_zh"),
    "code": ("lcc", "repobench-p"),
}
LONGBENCH_E_BUCKETS = ("0-4k", "4-8k", "8k+")
LONGBENCH_V2_BREAKDOWN = ("easy", "hard", "short", "medium", "long")


@dataclass(frozen=True)
class Benchmark:
    """How one benchmark's tables read: ``breakdown`` is ``"length"`` (a column per run length), ``"official"``
    (the task's ``score_<name>`` sub-scores, in ``columns``) or ``"category"`` (a column per task category)."""

    name: str
    breakdown: str
    columns: tuple[str, ...] = ()


BENCHMARKS = {
    "RULER": Benchmark("RULER", "length"),
    "LongBench-E": Benchmark("LongBench-E", "official", LONGBENCH_E_BUCKETS),
    "LongBench-v2": Benchmark("LongBench-v2", "official", LONGBENCH_V2_BREAKDOWN),
    "LongBench": Benchmark("LongBench", "category"),
    "testbed": Benchmark("testbed", "category"),
    **{name: Benchmark(name, "length") for name in ("RULER v2", "LongBench-Pro", "NoLiMa", "BABILong", "MRCR",
                                                    "GraphWalks", "HELMET")},
}


def benchmark_of(task: str) -> Benchmark:
    """The benchmark of a registered task name (a task of no known benchmark is one of its own, read per length)."""
    for prefix, name in (("ruler_", "RULER"), ("ruler2_", "RULER v2"), ("longbench_e_", "LongBench-E"),
                         ("longbench_v2", "LongBench-v2"), ("longbench_pro", "LongBench-Pro"),
                         ("longbench_", "LongBench"), ("testbed_", "testbed"), ("nolima", "NoLiMa"),
                         ("babilong_", "BABILong"), ("mrcr_", "MRCR"), ("graphwalks_", "GraphWalks"),
                         ("helmet_", "HELMET")):
        if task.startswith(prefix):
            return BENCHMARKS[name]
    return Benchmark(task, "length")


def task_category(task: str) -> str:
    """The benchmark's category of a task (RULER family, LongBench task type), or the task's benchmark name."""
    benchmark = benchmark_of(task)
    if benchmark.name == "RULER":
        short = task.removeprefix("ruler_")
        return next((family for key, family in RULER_FAMILIES.items() if short.startswith(key)), "other")
    if benchmark.name in ("LongBench", "LongBench-E"):
        dataset = task.removeprefix("longbench_e_").removeprefix("longbench_")
        return next((kind for kind, names in LONGBENCH_TYPES.items() if dataset in names), "other")
    return benchmark.name
