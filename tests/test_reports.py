"""Reports: cells → per-model summaries on shared cells, Pareto frontiers, Markdown/HTML/SVG, and the CLI."""

from __future__ import annotations

import json
import math
import xml.dom.minidom

import pytest

from elastic_bench import cli
from elastic_bench.files import digest, write_json, write_jsonl
from elastic_bench.reports import load_cells, pareto_front, summarize, write_report


def _cell(root, method, task, length, score, esr, prefill, status="complete", model="m", device="NVIDIA H200",
          backend="split"):
    folder = root / model / method / task / str(length)
    metrics = {"status": status, "num_samples": 4, "device": device, "backend_used": backend}
    if status == "complete":
        write_jsonl(folder / "predictions.jsonl", [{"id": str(i), "score": score / 100} for i in range(4)])
        metrics.update(score=score, omega_msr=esr * 2, omega_esr=esr, prefill_seconds=prefill * 2,
                       prefill_seconds_median=prefill, predictions_sha256=digest(folder / "predictions.jsonl"))
    else:
        metrics["error"] = "out of memory at 4096 tokens (rank 0)"
    write_json(folder / "metrics.json", metrics)


@pytest.fixture
def run_dir(tmp_path):
    root = tmp_path / "run"
    for task, full_score in (("ruler_niah", 90.0), ("lb_qa", 40.0)):
        for length in (1024, 2048):
            _cell(root, "full", task, length, full_score, 0.0, 2.0)
            _cell(root, "streaming", task, length, full_score - 30, 0.6, 1.0)
            _cell(root, "elastic", task, length, full_score - 5, 0.4, 1.25)
            _cell(root, "bad", task, length, full_score - 40, 0.3, 1.5)  # dominated by elastic
    _cell(root, "full", "ruler_niah", 4096, 88.0, 0.0, 8.0)  # not run by the others: excluded from means
    _cell(root, "streaming", "ruler_niah", 4096, 0, 0, 0, status="failed")
    (root / "m" / "elastic" / "ruler_niah" / "4096").mkdir(parents=True)  # a cell still running: no metrics yet
    return root


def test_pareto_front_keeps_the_non_dominated_points():
    points = [(0.0, 90.0), (0.6, 60.0), (0.4, 85.0), (0.3, 50.0), (0.6, 60.0), (math.nan, 99.0)]
    assert pareto_front(points) == [0, 2, 1, 4]  # ties both stay; NaN never; (0.3, 50) is beaten by (0.4, 85)
    assert pareto_front([]) == []


def test_summaries_compare_methods_on_the_cells_all_of_them_completed(run_dir):
    cells = load_cells(run_dir)
    assert len(cells) == 18 and sum(not c.complete for c in cells) == 1
    (report,) = summarize(cells)
    assert [s.method for s in report.methods] == ["full", "bad", "elastic", "streaming"]  # full first
    assert report.tasks == ["lb_qa", "ruler_niah"] and report.lengths == [1024, 2048]
    full, bad, elastic, streaming = report.methods
    assert full.score == pytest.approx(65.0)  # the 4096 cell of full alone is excluded
    assert elastic.task_scores == {"lb_qa": 35.0, "ruler_niah": 85.0}
    assert elastic.omega_esr == pytest.approx(0.4) and elastic.omega_msr == pytest.approx(0.8)
    assert streaming.speedup == pytest.approx(2.0) and elastic.speedup == pytest.approx(1.6)
    frontiers = {f.axis: f.methods for f in report.frontiers}
    assert frontiers == {"omega_esr": ["full", "elastic", "streaming"], "speedup": ["full", "elastic", "streaming"]}
    assert [(c.method, c.length) for c in report.excluded] == [("full", 4096)]
    assert [(c.method, c.error) for c in report.failed] == [("streaming", "out of memory at 4096 tokens (rank 0)")]


def test_without_full_there_is_no_speedup(tmp_path):
    _cell(tmp_path, "streaming", "t", 1024, 10.0, 0.5, 1.0)
    _cell(tmp_path, "elastic", "t", 1024, 20.0, 0.2, 1.0)
    (report,) = summarize(load_cells(tmp_path))
    assert [f.axis for f in report.frontiers] == ["omega_esr"]
    assert all(s.speedup is None for s in report.methods)


def test_report_files_render_tables_frontiers_and_failures(run_dir, tmp_path):
    written = write_report(summarize(load_cells(run_dir)), tmp_path / "out", source=str(run_dir))
    assert sorted(p.name for p in written) == ["m__omega_esr.svg", "m__speedup.svg", "report.html", "report.md"]
    md = (tmp_path / "out" / "report.md").read_text()
    row = "| elastic | 60.00 | 35.00 | 85.00 | 0.800 | 0.400 | 1.250 | split | NVIDIA H200 | 1.60 | omega_esr, speedup"
    assert row + " |" in md  # prefill: the cells' medians
    assert "| bad | 25.00 | 0.00 | 50.00 | 0.600 | 0.300 | 1.500 | split | NVIDIA H200 | 1.33 | – |" in md
    assert "does not measure kernel speed" not in md
    assert "Pareto frontier, score vs ΩESR (fraction of causal pairs skipped): full → elastic → streaming" in md
    assert "- full · ruler_niah · 4096" in md and "- streaming · ruler_niah · 4096: out of memory" in md
    html = (tmp_path / "out" / "report.html").read_text()
    assert html.count("<svg") == 2 and "<td>elastic</td>" in html
    svg = xml.dom.minidom.parse(str(tmp_path / "out" / "m__omega_esr.svg"))
    assert len(svg.getElementsByTagName("circle")) == 4
    frontier = svg.getElementsByTagName("polyline")[0].getAttribute("points").split()
    assert len(frontier) == 3


def test_cli_writes_the_report_and_rejects_bad_input(run_dir, tmp_path, capsys):
    assert cli.main(["report", str(run_dir)]) == 0
    assert (run_dir / "report" / "report.html").exists()
    assert "report written to" in capsys.readouterr().out
    assert cli.main(["report", str(tmp_path / "missing")]) != 0
    assert "no run folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli.main(["report", str(tmp_path / "empty")]) != 0
    assert "holds no results" in capsys.readouterr().err
    (run_dir / "m" / "full" / "lb_qa" / "1024" / "metrics.json").write_text(json.dumps({"score": 1}))
    assert cli.main(["report", str(run_dir)]) != 0
    assert "is not a cell's metrics.json" in capsys.readouterr().err


def test_reports_import_no_torch():
    import subprocess
    import sys

    code = "import sys, elastic_bench.reports; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_complete_cell_whose_predictions_were_cut_is_reported_as_failed(run_dir):
    predictions = run_dir / "m" / "elastic" / "lb_qa" / "1024" / "predictions.jsonl"
    predictions.write_text(predictions.read_text()[:-10])  # a torn last line
    cell = next(c for c in load_cells(run_dir) if (c.method, c.task, c.length) == ("elastic", "lb_qa", 1024))
    assert not cell.complete and "not the one its metrics.json was computed from" in cell.error


def test_speedups_timed_on_the_cpu_or_the_reference_backend_are_marked(tmp_path):
    _cell(tmp_path, "full", "t", 1024, 50.0, 0.0, 2.0, device="cpu (x86_64)", backend="reference")
    _cell(tmp_path, "streaming", "t", 1024, 40.0, 0.5, 4.0, device="cpu (x86_64)", backend="reference")
    write_report(summarize(load_cells(tmp_path)), tmp_path / "out", source=str(tmp_path))
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| reference | cpu (x86_64) | 0.50 * |" in md and "does not measure kernel speed" in md
