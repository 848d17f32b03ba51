"""Benchmark protocols (`elastic_bench.results.protocols`) pinned against hand-computed values of the Elastic Attention
paper's own tables: the 11-task RULER mean, the sample-weighted LongBench-E Avg (Table 7, to 0.01), the LongBench-v2
Easy / Hard fractions of 150 / 266 items, and a printed RULER Avg that its columns do not give, shown beside the one
they give."""

from __future__ import annotations

import math

import pytest

from elastic_bench import tasks
from elastic_bench.reports import load_cells, summarize, write_report
from elastic_bench.reports.published import load_published, matches
from elastic_bench.reports.tables import benchmark_tables
from elastic_bench.results.protocols import OFFICIAL, PAPER, get_protocol, reproduces
from elastic_bench.results.store import Cell

LLAMA = "meta-llama--Llama-3.1-8B-Instruct"
# Table 10, Llama-3.1-8B-Instruct (full attention): RULER at 8K-256K, and its printed Avg
LLAMA_RULER = {8192: 92.88, 16384: 92.83, 32768: 89.46, 65536: 70.79, 131072: 80.12, 262144: 72.34}
LLAMA_RULER_AVG = 83.47
# Table 7, Llama-3.1-8B-Instruct (full attention), in the order of the paper-results.md item counts
LLAMA_LBE = {"multifieldqa_en": 53.44, "qasper": 44.06, "hotpotqa": 59.62, "2wikimqa": 44.08, "gov_report": 34.50,
             "multi_news": 26.02, "trec": 71.00, "triviaqa": 90.54, "samsum": 42.94, "passage_count": 12.67,
             "passage_retrieval_en": 99.33, "lcc": 63.85, "repobench-p": 47.78}
LLAMA_LBE_AVG = 53.28


def write_cell(root, task, length, score, folder="full", extra=None):
    """A complete ``full`` cell of one sample scoring ``score`` percent (``extra``: more metrics.json fields)."""
    cell = Cell(root, LLAMA, folder, task, length)
    cell.dir.mkdir(parents=True, exist_ok=True)
    cell.append({"id": "0", "score": score / 100, "metadata": {}, "omega_msr": 0.0, "omega_esr": 0.0})
    cell.finish({"status": "complete", "num_samples": 1, "method": "full", "method_options": {},
                 "fingerprint": {"artifacts": {}}, "device": "NVIDIA H200", "backend_used": "split", "score": score,
                 "omega_msr": 0.0, "omega_esr": 0.0, "prefill_seconds_median": 1.0, **(extra or {})})


def test_the_paper_protocol_names_registered_tasks_and_every_name_resolves():
    registered = set(tasks.names())
    for bench in PAPER.benchmarks.values():
        assert set(bench.tasks) <= registered, bench.benchmark
    ruler = set(PAPER.benchmark("RULER").tasks)
    assert len(ruler) == 11 and not {"ruler_vt", "ruler_cwe"} & ruler
    assert PAPER.benchmark("LongBench") is OFFICIAL.benchmark("LongBench")  # the paper reports none: official's
    assert OFFICIAL.benchmark("RULER").includes("ruler_vt") and not PAPER.benchmark("RULER").includes("ruler_vt")
    assert OFFICIAL.benchmark("my_bench").task_mean({"a": 1.0, "b": 3.0}) == 2.0  # undeclared: equal weights
    with pytest.raises(ValueError, match="unknown protocol 'papr'; valid: official, paper"):
        get_protocol("papr")


def test_ruler_under_the_paper_protocol_is_the_11_task_mean_and_its_printed_avg_is_shown_beside_its_columns(tmp_path):
    """Every paper task scores the paper's per-length figure and vt, cwe score 0: the paper's 11-task mean is the
    figure itself (Δ 0), the official 13-task mean is 11/13 of it, and the printed Avg (83.47) is not the mean of the
    six columns (498.42 / 6 = 83.07)."""
    root = tmp_path / "run"
    for length, figure in LLAMA_RULER.items():
        for task in OFFICIAL_RULER:
            write_cell(root, task, length, figure if PAPER.benchmark("RULER").includes(task) else 0.0)
    cells = load_cells(root)
    (official,) = summarize(cells)
    (paper,) = summarize(cells, PAPER)
    found = {m.length: m for m in matches(official) if m.figure.benchmark == "RULER"}  # the figures' own protocol
    assert {n: round(m.measured, 6) for n, m in found.items() if n} == LLAMA_RULER
    assert all(m.cells == 11 and m.protocol == "paper" for n, m in found.items() if n)
    average = found[None]
    assert average.measured == pytest.approx(498.42 / 6) and average.figure.score == LLAMA_RULER_AVG
    assert average.recomputed == pytest.approx(83.07) and average.shows_both
    assert average.difference == pytest.approx(83.07 - 83.47)
    per_length = [m for n, m in found.items() if n]
    assert not any(m.shows_both for m in per_length)  # a per-length figure is a column, not an average

    ruler_official = {t.id: t for t in dict(benchmark_tables(official))["RULER"]}
    ruler_paper = {t.id: t for t in dict(benchmark_tables(paper))["RULER"]}
    assert ruler_official["ruler-length"].frame.loc["full", "8192"] == pytest.approx(92.88 * 11 / 13)
    assert ruler_paper["ruler-length"].frame.loc["full", "8192"] == pytest.approx(92.88)
    assert ruler_paper["ruler-length"].frame.loc["full", "average"] == pytest.approx(83.07)
    assert {c.task for c in paper.outside} == {"ruler_vt", "ruler_cwe"} and not official.outside

    write_report([paper], tmp_path / "report", source="x")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "**RULER: score by length** · protocol: paper" in md
    assert "Cells outside the `paper` protocol" in md and "ruler_vt · 8192" in md
    row = next(line for line in md.splitlines() if line.startswith("| full · RULER average"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:7] == ["83.07", "83.47", "-0.40", "83.07", "+0.00"]  # measured, printed, Δ, from columns, Δ


OFFICIAL_RULER = [t for t in tasks.names() if t.startswith("ruler_")]


def test_the_longbench_e_avg_is_the_item_weighted_mean_and_reproduces_table_7_to_a_hundredth(tmp_path):
    published = load_published()
    bench = PAPER.benchmark("LongBench-E")
    # by hand: 150·53.44 + 224·44.06 + 300·59.62 + 300·44.08 + 300·34.50 + 294·26.02 + 300·(71.00 + 90.54 + 42.94
    # + 12.67 + 99.33 + 63.85 + 47.78) = 195428.32 over 3668 items
    assert sum(bench.task_weights.values()) == 3668
    weighted = bench.task_mean({f"longbench_e_{k}": v for k, v in LLAMA_LBE.items()})
    assert weighted == pytest.approx(195428.32 / 3668) and abs(weighted - LLAMA_LBE_AVG) <= 0.01
    assert abs(sum(LLAMA_LBE.values()) / 13 - LLAMA_LBE_AVG) > 0.2  # the equal mean does not give it (53.06)
    averages = [f for f in published.figures if f.benchmark == "LongBench-E" and f.task is None]
    assert len(averages) == 21  # every Table 7 row of the methods here
    for figure in averages:
        assert reproduces(figure.score, published.recomputed(figure)), figure

    root = tmp_path / "run"
    for dataset, score in LLAMA_LBE.items():
        write_cell(root, f"longbench_e_{dataset}", 8192, score)
    (comparison,) = summarize(load_cells(root))
    (avg,) = [m for m in matches(comparison) if m.figure.benchmark == "LongBench-E" and m.figure.task is None]
    assert avg.measured == pytest.approx(195428.32 / 3668) and abs(avg.difference) <= 0.01 and not avg.shows_both
    per_task = [m for m in matches(comparison) if m.figure.task is not None and m.figure.benchmark == "LongBench-E"]
    assert len(per_task) == 13 and all(m.difference == pytest.approx(0) for m in per_task)
    table = {t.id: t for t in dict(benchmark_tables(comparison))["LongBench-E"]}["longbench-e-score"].frame
    assert table.loc["average", "full"] == pytest.approx(sum(LLAMA_LBE.values()) / 13)  # official: equal
    (paper,) = summarize(load_cells(root), PAPER)
    table = {t.id: t for t in dict(benchmark_tables(paper))["LongBench-E"]}["longbench-e-score"].frame
    assert table.loc["average", "full"] == pytest.approx(195428.32 / 3668)


def test_longbench_v2_easy_and_hard_are_fractions_of_150_and_266_items(tmp_path):
    published = load_published()
    items = PAPER.benchmark("LongBench-v2").breakdown_weights
    assert items == {"easy": 150, "hard": 266}
    # Llama-3.1-8B-Instruct, full (Table 10): 48 of 150 easy, 88 of 266 hard, 136 of 416 overall
    assert (round(100 * 48 / 150, 2), round(100 * 88 / 266, 2), round(100 * 136 / 416, 2)) == (32.00, 33.08, 32.69)
    subs = [f for f in published.figures if f.breakdown]
    exact = [f for f in subs if any(round(100 * k / items[f.breakdown], 2) == f.score
                                    for k in range(items[f.breakdown] + 1))]
    assert len(subs) == 42 and len(exact) == 37  # the other five say so in their notes
    assert all("exact fraction" in f.note for f in subs if f not in exact)
    assert not any(round(100 * k / 192, 2) == 32.00 and round(100 * j / 311, 2) == 33.08
                   for k in range(193) for j in range(312))  # not fractions of the full set's 192 easy / 311 hard
    overall = [f for f in published.figures if f.benchmark == "LongBench-v2" and f.breakdown is None]
    reproduced = [f for f in overall if reproduces(f.score, published.recomputed(f))]
    # every Avg is Easy and Hard weighted 150 : 266 but two PruLong rows' (Table 2: 24.35 printed for 24.23 and 28.61
    # for 28.59), whose Easy / Hard are not exact fractions either
    assert {(f.model, f.method) for f in overall if f not in reproduced} == {("Qwen3-4B", "prulong"),
                                                                             ("Llama-3.1-8B-Instruct", "prulong")}

    root = tmp_path / "run"
    write_cell(root, "longbench_v2", 131072, 32.7,
               extra={"score_easy": 31.8, "score_hard": 33.4})  # the official result.py's 1-decimal sub-scores
    (comparison,) = summarize(load_cells(root))
    found = {m.figure.name: m for m in matches(comparison) if m.figure.benchmark == "LongBench-v2"}
    assert set(found) == {"LongBench-v2", "LongBench-v2 · easy", "LongBench-v2 · hard"}
    assert found["LongBench-v2 · easy"].measured == 31.8 and found["LongBench-v2 · hard"].measured == 33.4
    assert all("not identifiable from public data" in m.items for m in found.values())
    assert found["LongBench-v2"].recomputed == pytest.approx((150 * 32.00 + 266 * 33.08) / 416)
    assert not found["LongBench-v2"].shows_both
    write_report([comparison], tmp_path / "report", source="x")
    assert "416 of the 503 items" in (tmp_path / "report" / "report.md").read_text()


def test_a_printed_average_that_its_columns_give_is_shown_alone():
    published = load_published()
    rows = {(f.model, f.method, f.mode): f for f in published.figures
            if f.benchmark == "RULER" and f.length is None}
    xa_ssa = rows[("Qwen3-4B", "elastic", "xa-ssa")]  # 81.43 80.68 51.12 65.69 49.96 53.30 → 63.70 printed
    assert reproduces(xa_ssa.score, published.recomputed(xa_ssa))
    full = rows[("Llama-3.1-8B-Instruct", "full", None)]
    assert not reproduces(full.score, published.recomputed(full))
    gaps = [f.score - published.recomputed(f) for f in rows.values()]  # printed − the mean of its six columns
    assert min(gaps) == pytest.approx(-2.94, abs=0.005) and max(gaps) == pytest.approx(1.04, abs=0.005)
    assert sum(reproduces(f.score, published.recomputed(f)) for f in rows.values()) == 1  # of 21 rows
    assert not math.isnan(published.recomputed(full))
