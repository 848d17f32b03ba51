"""The report side of learned-file provenance, from hand-made cell files carrying the fields the runner records
(``artifact_provenance``, ``in_distribution``, ``allow_in_distribution``): a row beside a published figure is a
reproduction only when every learned file was trained with the paper's recipe, and every in-distribution cell is
marked in the Markdown, HTML and terminal tables (red in HTML where the run allowed it)."""

from __future__ import annotations

import re

import pytest

from elastic_bench.evaluation.terminal import IN_DISTRIBUTION_LEGEND, format_rows, summary_row
from elastic_bench.reports import load_cells, summarize, write_report
from elastic_bench.reports.published import matches
from elastic_bench.reports.tables import benchmark_tables, legend
from elastic_bench.results.protocols import PAPER
from elastic_bench.results.store import Cell, finished

LLAMA = "meta-llama--Llama-3.1-8B-Instruct"
PAPER_ROUTER = {"data": {"source": "official:elastic-sft-mixture", "path": None, "sha256": "ab" * 32,
                         "identities": ["dataset:narrativeqa"], "tasks": {"Single QA": "sensitive"},
                         "lengths": [8192, 65536], "records": 7200},
                "steps": 300, "tokens_seen": 740_000_000, "recipe": "paper"}
RECORDS_ROUTER = {"data": {"source": "records", "path": "records.jsonl", "sha256": "cd" * 32,
                           "identities": ["generator:ruler.niah", "generator:records.passkey"],
                           "tasks": {"niah_single": "sensitive", "copy": "robust"}, "lengths": [1024, 4096],
                           "records": 768},
                  "steps": 300, "tokens_seen": 4_000_000, "recipe": "custom"}
IN_DIST = [{"artifact": "router", "shared": ["generator:ruler.niah"]}]
FOLDERS = {  # folder → (metrics fields, options)
    "full": ({}, {}),
    "elastic-preset=elastic-paper-router=paper-mode=fa-xa": (
        {"artifact_provenance": {"router": PAPER_ROUTER}, "in_distribution": [], "allow_in_distribution": False},
        {"mode": "fa-xa"}),
    "elastic-preset=elastic-paper-router=records-mode=fa-ssa": (
        {"artifact_provenance": {"router": RECORDS_ROUTER}, "allow_in_distribution": True}, {"mode": "fa-ssa"}),
    "duo_attention-preset=elastic-paper-pattern=released": ({"artifact_provenance": {"pattern": None}}, {}),
    "prulong-preset=elastic-paper-pattern=records": (
        {"artifact_provenance": {"pattern": RECORDS_ROUTER}, "allow_in_distribution": False}, {}),
}


def write_cell(root, folder, task, length, fields, options):
    cell = Cell(root, LLAMA, folder, task, length)
    cell.dir.mkdir(parents=True, exist_ok=True)
    for i in range(2):
        cell.append({"id": str(i), "score": 0.8, "metadata": {}, "omega_msr": 0.5, "omega_esr": 0.4})
    artifacts = {k: "0123abcd" * 8 for k in fields.get("artifact_provenance", {})}
    niah = task.startswith("ruler_niah")
    in_dist = [{**f, "artifact": next(iter(artifacts))} for f in IN_DIST] if niah and "records" in folder else []
    cell.finish({"status": "complete", "num_samples": 2, "method": folder.split("-")[0], "method_options": options,
                 "preset": None if folder == "full" else "elastic-paper", "fingerprint": {"artifacts": artifacts},
                 "device": "NVIDIA H200", "backend_used": "split", "score": 80.0, "omega_msr": 0.5, "omega_esr": 0.4,
                 "prefill_seconds_median": 1.0, **fields, "in_distribution": in_dist})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("learned") / "run"
    for folder, (fields, options) in FOLDERS.items():
        for task in PAPER.benchmark("RULER").tasks:
            write_cell(root, folder, task, 8192, fields, options)
    return root


def test_a_row_is_a_reproduction_only_when_every_learned_file_follows_the_paper_recipe(run_dir):
    (comparison,) = summarize(load_cells(run_dir))
    kinds = {m.label: (m.kind, m.why) for m in matches(comparison) if m.figure.benchmark == "RULER"}
    assert kinds == {
        "full": ("reproduction", ""),
        "elastic (preset=elastic-paper, router=paper, mode=fa-xa)": ("reproduction", ""),
        "elastic (preset=elastic-paper, router=records, mode=fa-ssa)": (
            "comparison", "router: custom recipe, trained on records"),
        "duo_attention (preset=elastic-paper, pattern=released)": ("comparison", "pattern: provenance unknown"),
        "prulong (preset=elastic-paper, pattern=records)": ("comparison", "pattern: custom recipe, trained on records"),
    }
    shown = legend(comparison).frame["trained on"]
    assert shown["elastic (preset=elastic-paper, router=records, mode=fa-ssa)"] == (
        "router: records (copy, niah_single), 768 records, at 1024-4096 tokens, 300 steps, custom recipe")
    assert shown["duo_attention (preset=elastic-paper, pattern=released)"] == "pattern: provenance unknown"
    assert shown["full"] == "–"


def test_every_in_distribution_cell_is_marked_in_markdown_and_html_and_red_where_allowed(run_dir, tmp_path):
    (comparison,) = summarize(load_cells(run_dir))
    tables = {t.id: t for t in dict(benchmark_tables(comparison))["RULER"]}
    shown = tables["ruler-score"].formatted()
    allowed = "elastic (preset=elastic-paper, router=records, mode=fa-ssa)"
    refused = "prulong (preset=elastic-paper, pattern=records)"
    niah = [t for t in shown.index if t.startswith("ruler_niah")]
    assert all(shown.loc[t, allowed] == "80.00 ‡" and shown.loc[t, refused] == "80.00 †" for t in niah)
    assert shown.loc["ruler_qa_1", allowed] == "80.00" and shown.loc["ruler_fwe", refused] == "80.00"  # held out
    assert shown.loc["average", allowed].endswith("‡")  # an average over a marked cell is marked
    assert not shown["full"].str.contains("†|‡").any()
    write_report([comparison], tmp_path / "out", source="x")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "In-distribution cells" in md
    assert f"- m · {allowed}" not in md  # folded per result folder, not per label
    assert "router was trained on generator:ruler.niah (scored under --allow-in-distribution)" in md
    assert md.count("‡: the same, scored because the run was given --allow-in-distribution") >= 1
    html = (tmp_path / "out" / "report.html").read_text()
    red = re.findall(r'<td class="[^"]*allowed[^"]*">([^<]*)</td>', html)
    assert red and all(value.endswith("‡") for value in red)
    assert not any("†" in value for value in red)  # not allowed: marked, not red
    assert "td.allowed{color:#c00000" in html


def test_the_terminal_table_marks_in_distribution_cells(run_dir):
    rows = [summary_row(cell) for cell in finished(run_dir)]
    text = format_rows(rows, "runs/x")
    lines = [line for line in text.splitlines() if "ruler_niah_single_1" in line]
    assert any(line.split()[1].startswith("elastic-preset") and line.rstrip().endswith("‡") for line in lines)
    assert any(line.split()[1].startswith("prulong") and line.rstrip().endswith("†") for line in lines)
    assert IN_DISTRIBUTION_LEGEND in text and "in-dist" in text
    held_out = [summary_row(cell) for cell in finished(run_dir) if cell.method == "full"]
    assert "in-dist" not in format_rows(held_out, "runs/x")  # the column shows only where a cell is marked
