"""Reports: cells → comparisons on shared cells, tables, Pareto frontiers, Markdown/HTML/PNG, and the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from fixtures.cells import ruler_line

from elastic_bench import cli
from elastic_bench.reports import compare, load_cells, pareto_front, render, run_names, summarize, write_report
from elastic_bench.reports.labels import folder_options, short_label
from elastic_bench.reports.tables import adaptive_sparsity, benchmark_tables, legend, pair_differences
from elastic_bench.results.store import Cell


def _row(md: str, first: str, after: str = "") -> list[str]:
    """The cells of the first Markdown table row named ``first`` (after the line containing ``after``)."""
    lines = md[md.index(after):].splitlines()
    line = next(x for x in lines if x.startswith("|") and x.strip("|").split("|")[0].strip() == first)
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _cell(root, method, task, length, score, esr, prefill, status="complete", model="m", device="NVIDIA H200",
          backend="split", options=None, category=None, scores=None, artifacts=None, git_hash="abc123", resolved=None,
          learned=None):
    """A cell as the runner writes it, through the results store (its predictions' count, ids and digest recorded);
    ``resolved``: the unset options as the method ran with them; ``learned``: the names of its learned files."""
    cell = Cell(root, model, method, task, length)
    cell.dir.mkdir(parents=True, exist_ok=True)
    metrics = {"status": status, "num_samples": 4, "device": device, "backend_used": backend,
               "method": method.split("-")[0], "method_options": options or {}, "versions": {"torch": "2.9"},
               "fingerprint": {"method": method.split("-")[0], "artifacts": artifacts or {}},
               "git_hash": git_hash, "source_digest": "5ca1ab1e0ddba11s", "date": "2026-01-01T00:00:00+00:00",
               **({"method_resolved": resolved} if resolved else {}), **({"learned_files": learned} if learned else {})}
    if status == "complete":
        meta = {"length": length, **({"category": category} if category else {})}
        for i, s in enumerate(scores or [score / 100] * 4):
            cell.append({"id": str(i), **(ruler_line(s) if task.startswith("ruler_") else {}), "score": s,
                         "metadata": meta, "omega_msr": esr * 2, "decisions": [[i % 2, 1], [0, 1]]})
        metrics.update(score=score, omega_msr=esr * 2, omega_esr=esr, prefill_seconds=prefill * 2,
                       prefill_seconds_median=prefill)
    else:
        metrics["error"] = "out of memory at 4096 tokens (rank 0)"
    cell.finish(metrics)


@pytest.fixture
def run_dir(tmp_path):
    root = tmp_path / "run"
    for task, full_score in (("ruler_niah_single_1", 90.0), ("lb_qa", 40.0)):
        for length in (1024, 2048):
            _cell(root, "full", task, length, full_score, 0.0, 2.0)
            _cell(root, "streaming", task, length, full_score - 30, 0.6, 1.0)
            _cell(root, "elastic", task, length, full_score - 5, 0.4, 1.25)
            _cell(root, "bad", task, length, full_score - 40, 0.3, 1.5)  # dominated by elastic
    _cell(root, "full", "ruler_niah_single_1", 4096, 88.0, 0.0, 8.0)  # not run by the others: excluded from means
    _cell(root, "streaming", "ruler_niah_single_1", 4096, 0, 0, 0, status="failed")
    _cell(root, "elastic", "ruler_niah_single_1", 4096, 0, 0, 0, status="failed")
    (root / "m" / "bad" / "ruler_niah_single_1" / "4096").mkdir(parents=True)  # still running: no metrics yet
    return root


def test_pareto_front_keeps_the_non_dominated_points():
    points = [(0.0, 90.0), (0.6, 60.0), (0.4, 85.0), (0.3, 50.0), (0.6, 60.0), (math.nan, 99.0)]
    assert pareto_front(points) == [0, 2, 1, 4]  # ties both stay; NaN never; (0.3, 50) is beaten by (0.4, 85)
    assert pareto_front([]) == []


def test_pareto_front_equals_a_brute_force_filter_on_random_points():
    import random

    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 30)
        grid = rng.choice([3, 10, 1000])  # small grids make ties and equal points common
        points = [(rng.randrange(grid) / grid, rng.randrange(grid) / grid) for _ in range(n)]
        brute = [i for i, (x, y) in enumerate(points)
                 if not any(a >= x and b >= y and (a, b) != (x, y) for a, b in points)]
        assert sorted(pareto_front(points)) == brute, points


def test_comparisons_use_the_cells_all_configurations_completed(run_dir):
    cells = load_cells(run_dir)
    assert len(cells) == 19 and sum(not c.complete for c in cells) == 2
    (comparison,) = summarize(cells)
    assert [c.label for c in comparison.configs] == ["full", "bad", "elastic", "streaming"]  # full first
    assert comparison.tasks == ["lb_qa", "ruler_niah_single_1"] and comparison.lengths == [1024, 2048]
    full, bad, elastic, streaming = comparison.configs
    assert full.score == pytest.approx(65.0)  # the 4096 cell of full alone is excluded
    assert elastic.omega_esr == pytest.approx(0.4) and elastic.omega_msr == pytest.approx(0.8)
    assert streaming.speedup == pytest.approx(2.0) and elastic.speedup == pytest.approx(1.6)
    frontiers = {f.axis: f.labels for f in comparison.frontiers}
    assert frontiers == {"omega_esr": ["full", "elastic", "streaming"], "speedup": ["full", "elastic", "streaming"]}
    assert [(c.method, c.length) for c in comparison.excluded] == [("full", 4096)]
    assert {c.method for c in comparison.failed} == {"elastic", "streaming"}
    assert full.routes_per_prompt  # the fixture's decisions alternate between samples


def test_benchmark_tables_group_tasks_and_average_them(run_dir):
    (comparison,) = summarize(load_cells(run_dir))
    found = dict(benchmark_tables(comparison))
    assert set(found) == {"RULER", "lb_qa"}  # an unknown task is a benchmark of its own
    ruler = {t.id: t for t in found["RULER"]}
    by_length = ruler["ruler-length"].frame
    assert by_length.loc["elastic", "1024"] == pytest.approx(85.0) and by_length.loc["elastic", "average"] == 85.0
    matrix = ruler["ruler-task-length"].frame
    assert matrix.loc["average @ 2048", "bad"] == pytest.approx(50.0)
    assert ruler["ruler-msr"].frame.loc["ruler_niah_single_1", "streaming"] == pytest.approx(1.2)
    assert ruler["ruler-score"].formatted().loc["average", "elastic"] == "85.00"  # scores: 2 decimals everywhere
    assert ruler["ruler-esr"].formatted().loc["average", "elastic"] == "0.400"  # sparsities: 3


def test_adaptive_sparsity_puts_the_categories_side_by_side(tmp_path):
    for method, msr in (("full", 0.0), ("elastic", None)):
        for task, category, esr in (("testbed_niah_single", "sensitive", 0.1), ("testbed_repeat", "robust", 0.45)):
            _cell(tmp_path, method, task, 1024, 100.0, 0.0 if msr == 0.0 else esr, 1.0, category=category)
    (comparison,) = summarize(load_cells(tmp_path))
    table = adaptive_sparsity(comparison).frame
    assert table.loc["elastic", "ΩMSR · sensitive"] == pytest.approx(0.2)
    assert table.loc["elastic", "ΩMSR · robust"] == pytest.approx(0.9)
    assert table.loc["full", "ΩMSR · robust"] == 0.0
    testbed = {t.id: t for t in dict(benchmark_tables(comparison))["testbed"]}
    assert list(testbed["testbed-category"].frame.columns) == ["robust", "sensitive", "average"]


def test_labels_are_short_and_never_show_absolute_paths(tmp_path):
    folder = "duo_attention-pattern=%2Fhome%2Fx%2FMeta-Llama-3.1-8B-Instruct-sparsity=0.7"
    options = {"pattern": "/home/x/Meta-Llama-3.1-8B-Instruct", "sparsity": 0.7, "sink": 64}
    assert short_label(folder, "duo_attention", options) == "duo_attention (pattern=Meta-Llama-3.1-8B-Instruct, s=0.7)"
    assert short_label("full", "full", {}) == "full"
    # options the cell does not record (a learned file, known by its digest) keep the value the folder gives them
    assert folder_options("elastic-router=r_0.6-sink=16", "elastic") == {"router": "r_0.6", "sink": "16"}
    assert short_label("elastic-router=sensitive_0.6", "elastic", {"mode": None}) == "elastic (router=sensitive_0.6)"
    _cell(tmp_path, folder, "t", 1024, 50.0, 0.3, 1.0, options=options)
    write_report(summarize(load_cells(tmp_path)), tmp_path / "out", source="x")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "/home/x" not in md and "%2F" not in md
    assert "| pattern=Meta-Llama-3.1-8B-Instruct, sparsity=0.7, sink=64 |" in md  # the legend: every option
    assert run_names(["a/demo", "b/demo"]) == ["a/demo", "b/demo"] and run_names(["x/a", "x/b"]) == ["a", "b"]


def test_a_label_names_the_learned_file_a_method_found_itself(tmp_path):
    """A method left at ``auto`` (result folder ``duo_attention``) is labelled with the file its cells record, beside
    the options its folder gives; the legend names the file too."""
    assert short_label("duo_attention", "duo_attention", {}, {"pattern": "testbed/duo_gates"}) == (
        "duo_attention (pattern=testbed/duo_gates)")
    assert short_label("elastic-sink=16", "elastic", {}, {"router": "testbed/elastic_router"}) == (
        "elastic (sink=16, router=testbed/elastic_router)")
    assert short_label("elastic-router=r_0.9", "elastic", {}, {"router": "r_0.9"}) == "elastic (router=r_0.9)"
    _cell(tmp_path, "full", "t", 1024, 50.0, 0.0, 1.0)
    _cell(tmp_path, "duo_attention", "t", 1024, 50.0, 0.3, 1.0, artifacts={"pattern": "ab" * 32},
          learned={"pattern": "testbed/duo_gates"})
    (comparison,) = summarize(load_cells(tmp_path))
    assert [c.label for c in comparison.configs] == ["full", "duo_attention (pattern=testbed/duo_gates)"]
    assert legend(comparison).frame.loc["duo_attention (pattern=testbed/duo_gates)", "learned files"] == (
        "pattern=testbed/duo_gates · abababab")


def test_every_mean_score_shows_the_samples_behind_it(tmp_path):
    for length in (1024, 2048):
        _cell(tmp_path, "full", "t", length, 50.0, 0.0, 1.0)
    (comparison,) = summarize(load_cells(tmp_path))
    write_report([comparison], tmp_path / "out", source=str(tmp_path))
    md = (tmp_path / "out" / "report.md").read_text()
    assert _row(md, "full")[2] == "8 (4 per cell)"
    assert "every score below is a mean over 4 samples per cell" in md


def test_no_zoom_panel_where_the_best_scores_are_all_one_value(tmp_path):
    """Scores that spread widely get a zoom on those near the best, unless those are one and the same score (every
    one 100: the zoom would show a flat line on 99.85-100.15)."""
    from elastic_bench.reports import plots

    def panels(scores: dict[str, float]) -> bool:
        for method, score in scores.items():
            _cell(tmp_path / str(sorted(scores.values())), method, "t", 1024, score, 0.1 * len(method), 1.0,
                  scores=[score / 100] * 4)
        (comparison,) = summarize(load_cells(tmp_path / str(sorted(scores.values()))))
        return "zooms" in plots.frontier(comparison, "omega_esr", "m").caption

    assert not panels({"full": 100.0, "elastic": 100.0, "streaming": 50.0})
    assert panels({"full": 100.0, "elastic": 97.0, "streaming": 50.0})


def test_paired_differences_match_samples_by_id(tmp_path):
    _cell(tmp_path, "full", "t", 1024, 75.0, 0.0, 1.0, scores=[1, 1, 1, 0])
    _cell(tmp_path, "streaming", "t", 1024, 25.0, 0.5, 1.0, scores=[1, 0, 0, 0])
    (comparison,) = summarize(load_cells(tmp_path))
    row = pair_differences(comparison).frame.loc["full − streaming"]
    assert row["Δ score"] == pytest.approx(50.0) and row["samples"] == 4
    assert (row["95% low"], row["95% high"]) == (0.0, 100.0)  # differences 0, 100, 100, 0


def test_without_full_there_is_no_speedup(tmp_path):
    _cell(tmp_path, "streaming", "t", 1024, 10.0, 0.5, 1.0)
    _cell(tmp_path, "elastic", "t", 1024, 20.0, 0.2, 1.0)
    (comparison,) = summarize(load_cells(tmp_path))
    assert [f.axis for f in comparison.frontiers] == ["omega_esr"]
    assert all(c.speedup is None for c in comparison.configs)


def test_report_files_render_tables_plots_and_failures_folded(run_dir, tmp_path):
    written = write_report(summarize(load_cells(run_dir)), tmp_path / "out", source=str(run_dir))
    names = sorted(p.name for p in written)
    assert "report.html" in names and "report.md" in names
    pngs = [p for p in written if p.suffix == ".png"]
    assert {"m-frontier-omega-esr.png", "m-frontier-speedup.png", "m-ruler-length.png", "m-routing-0.png"} <= \
        {p.name for p in pngs}
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in pngs)
    md = (tmp_path / "out" / "report.md").read_text()
    assert all(f"]({p.name})" in md for p in pngs)  # every plot beside the Markdown, linked
    assert _row(md, "elastic") == ["elastic", "60.00", "16 (4 per cell)", "0.800", "0.400", "1.250", "1.60", "split",
                                   "NVIDIA H200", "ΩESR, speedup"]
    assert _row(md, "bad") == ["bad", "25.00", "16 (4 per cell)", "0.600", "0.300", "1.500", "1.33", "split",
                               "NVIDIA H200", "–"]
    assert "does not measure kernel speed" not in md
    # the two failed cells share one message: it is printed once, with both cells
    assert md.count("out of memory at 4096 tokens") == 1
    assert "- out of memory at 4096 tokens (rank 0): m · elastic · ruler_niah_single_1 · 4096, m · streaming" in md
    assert "- m · full: not run or not complete elsewhere: ruler_niah_single_1 · 4096" in md
    html = (tmp_path / "out" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(pngs) and "<svg" not in html
    assert html.count('<table class="sortable">') == md.count("\n|:")  # every table of the Markdown is there
    assert "http://" not in html.replace("http-equiv", "") and "https://" not in html  # no address to fetch


def test_compare_puts_runs_side_by_side_on_the_cells_all_completed(run_dir, tmp_path):
    other = tmp_path / "other"
    for task in ("ruler_niah_single_1", "lb_qa"):
        _cell(other, "elastic", task, 1024, 50.0, 0.5, 1.0)  # only 1024: the comparison keeps 1024
    cells = load_cells(run_dir, run="run") + load_cells(other, run="other")
    (comparison,) = compare(cells)
    assert comparison.lengths == [1024]
    assert [c.label for c in comparison.configs] == ["run · full", "run · bad", "run · elastic", "run · streaming",
                                                     "other · elastic"]
    assert comparison.configs[-1].speedup is None  # the other run has no full
    pairs = {(p.a, p.b): p.difference for p in comparison.pairs()}
    assert len(pairs) == 10 and pairs[("run · elastic", "other · elastic")].mean == pytest.approx(10.0)
    assert cli.main(["compare", str(run_dir), str(other), "--output", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp" / "report.md").read_text()
    assert "**Methods × runs**" in md and "score · other" in md and "run · elastic − other · elastic" in md


def test_cli_writes_the_report_and_rejects_bad_input(run_dir, tmp_path, capsys):
    assert cli.main(["report", str(run_dir)]) == 0
    assert (run_dir / "report" / "report.html").exists()
    assert "report written to" in capsys.readouterr().out
    for argv, message in ((["report", str(tmp_path / "missing")], "no run folder"),
                          (["compare", str(run_dir)], "two or more run folders"),
                          (["compare", str(run_dir), str(tmp_path / "missing")], "no run folder"),
                          (["compare", str(run_dir), str(run_dir) + "/"], "given twice")):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    (tmp_path / "empty").mkdir()
    assert cli.main(["report", str(tmp_path / "empty")]) == 2
    assert "holds no results" in capsys.readouterr().err
    (run_dir / "m" / "full" / "lb_qa" / "1024" / "metrics.json").write_text(json.dumps({"score": 1}))
    assert cli.main(["report", str(run_dir)]) == 2
    assert "is not a cell's metrics.json" in capsys.readouterr().err


def test_reports_import_no_torch():
    code = "import sys, elastic_bench.reports; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_complete_cell_whose_predictions_were_cut_is_reported_as_failed(run_dir):
    predictions = run_dir / "m" / "elastic" / "lb_qa" / "1024" / "predictions.jsonl"
    predictions.write_text(predictions.read_text()[:-10])  # a torn last line
    cell = next(c for c in load_cells(run_dir) if (c.method, c.task, c.length) == ("elastic", "lb_qa", 1024))
    assert not cell.complete and "not the one its metrics.json was computed from" in cell.error


@pytest.mark.parametrize("device, backend, full_seconds", [("cpu (x86_64)", "reference", 2.0),
                                                            ("NVIDIA H200", "triton", 0.06)],
                         ids=["cpu", "launch-bound"])
def test_prefill_times_that_do_not_measure_attention_get_a_sentence_not_a_speedup_frontier(tmp_path, device, backend,
                                                                                            full_seconds):
    for length in (1024, 2048):
        _cell(tmp_path, "full", "t", length, 50.0, 0.0, full_seconds, device=device, backend=backend)
        _cell(tmp_path, "streaming", "t", length, 40.0, 0.5, full_seconds / 2, device=device, backend=backend)
    (comparison,) = summarize(load_cells(tmp_path))
    assert [f.axis for f in comparison.frontiers] == ["omega_esr"]
    why = "timed on the CPU" if device.startswith("cpu") else "60 ms in all 2 comparable cells, under the 100 ms"
    assert comparison.speedup_note.startswith("No speedup frontier:") and why in comparison.speedup_note
    written = write_report([comparison], tmp_path / "out", source=str(tmp_path))
    assert "m-frontier-speedup.png" not in {p.name for p in written}
    md = (tmp_path / "out" / "report.md").read_text()
    html = (tmp_path / "out" / "report.html").read_text()
    # no ratio that reads as a speedup: the reason in its place, and the sentence under the table
    assert _row(md, "streaming")[6] == ("none: CPU timing" if device.startswith("cpu") else "none: see the note")
    assert f"× full: {comparison.speedup_note}" in md and md.count(comparison.speedup_note) == 2  # under the table, and
    assert html.count("No speedup frontier:") == 2  # in the plot's place, in both files
    assert "speedup" not in _row(md, "streaming")[-1]  # on no speedup frontier


def test_a_long_enough_gpu_prefill_draws_the_speedup_frontier(tmp_path):
    _cell(tmp_path, "full", "t", 1024, 50.0, 0.0, 0.1)  # the threshold itself counts
    _cell(tmp_path, "streaming", "t", 1024, 40.0, 0.5, 0.05)
    (comparison,) = summarize(load_cells(tmp_path))
    assert comparison.speedup_note == "" and {f.axis for f in comparison.frontiers} == {"omega_esr", "speedup"}


def test_the_legend_of_a_two_router_run_tells_the_routers_apart(tmp_path):
    options = {"mode": None, "sink": None, "local": None, "seed": 0}
    for target, sha in (("0.6", "818e76e2" + "0" * 56), ("0.9", "d0927dae" + "1" * 56)):
        _cell(tmp_path, f"elastic-router=sensitive_{target}", "t", 1024, 98.0, 0.5, 1.0, options=options,
              artifacts={"router": sha})
    _cell(tmp_path, "full", "t", 1024, 99.0, 0.0, 2.0)
    (comparison,) = summarize(load_cells(tmp_path))
    labels = [c.label for c in comparison.configs]
    assert labels == ["full", "elastic (router=sensitive_0.6)", "elastic (router=sensitive_0.9)"]
    frame = legend(comparison).frame
    assert frame.loc["elastic (router=sensitive_0.6)", "learned files"] == "router=sensitive_0.6 · 818e76e2"
    assert frame.loc["elastic (router=sensitive_0.9)", "learned files"] == "router=sensitive_0.9 · d0927dae"
    assert frame.loc["elastic (router=sensitive_0.9)", "options"] == "seed=0"  # no `mode=None`
    assert frame.loc["elastic (router=sensitive_0.9)", "unset"] == "mode, sink, local"
    assert len(frame.drop_duplicates()) == len(frame)  # no two rows alike


def test_the_legend_shows_the_geometry_each_router_ran_with(tmp_path):
    """Two routers whose checkpoints set different streaming geometries: the legend shows what each ran with."""
    options = {"mode": None, "sink": None, "local": None, "seed": 0}
    for target, local in (("0.6", 256), ("0.9", 512)):
        _cell(tmp_path, f"elastic-router=sensitive_{target}", "t", 1024, 98.0, 0.5, 1.0, options=options,
              artifacts={"router": "0" * 64}, resolved={"mode": "fa-ssa", "sink": 16, "local": local})
    _cell(tmp_path, "full", "t", 1024, 99.0, 0.0, 2.0)
    (comparison,) = summarize(load_cells(tmp_path))
    frame = render.legend(comparison).frame
    assert list(frame["unset, as run"]) == ["–", "mode=fa-ssa, sink=16, local=256", "mode=fa-ssa, sink=16, local=512"]
    write_report([comparison], tmp_path / "out", source="x")
    assert "mode=fa-ssa, sink=16, local=512" in (tmp_path / "out" / "report.md").read_text()
    plain = tmp_path / "plain"  # cells that record none (runs before the runner did): no such column
    for method in ("full", "streaming"):
        _cell(plain, method, "t", 1024, 99.0, 0.0, 2.0)
    assert "unset, as run" not in render.legend(summarize(load_cells(plain))[0]).frame


def test_provenance_shows_a_dirty_tree_and_the_source_digest(tmp_path):
    dirty = "c70e9b71451b55fdadb97c158a658715849440e2-dirty"
    _cell(tmp_path, "full", "t", 1024, 99.0, 0.0, 2.0, git_hash=dirty)
    _cell(tmp_path, "streaming", "t", 1024, 50.0, 0.5, 1.0, git_hash="c70e9b71451b55fdadb97c158a658715849440e2")
    write_report(summarize(load_cells(tmp_path)), tmp_path / "out", source=str(tmp_path))
    md = (tmp_path / "out" / "report.md").read_text()
    assert _row(md, "git hash")[1] == "c70e9b71451b, c70e9b71451b-dirty"
    assert _row(md, "source digest")[1] == "5ca1ab1e0ddba11s"


def test_every_score_point_has_its_interval_from_the_per_sample_scores(run_dir):
    (comparison,) = summarize(load_cells(run_dir))
    for config in comparison.configs:
        interval = config.score_interval
        assert interval.n == 16 and interval.low <= config.score <= interval.high  # 4 cells × 4 samples
        assert interval.mean == pytest.approx(config.score)


def test_the_shipped_sweep_renders_with_its_routers_told_apart(tmp_path):
    from elastic_bench.evaluation.commands import SWEEP_RUN

    (comparison,) = summarize(load_cells(SWEEP_RUN))
    routers = [c.label for c in comparison.configs if c.method_name == "elastic"]
    assert routers == [f"elastic (router=sensitive_{t})" for t in ("0.6", "0.7", "0.8", "0.9")]
    assert all("=" not in c.label.split(" (")[0] for c in comparison.configs)  # no folder names as labels
    assert "launch" in comparison.speedup_note  # H200 prefills of a tiny model: 40-81 ms
    written = write_report([comparison], tmp_path / "out", source="sweep")
    assert all(p.exists() for p in written)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "c70e9b71451b-dirty" in md and len(set(legend(comparison).frame["learned files"])) == 7


def test_a_metrics_file_outside_a_cell_folder_is_refused_in_one_line(run_dir, capsys):
    task = run_dir / "m" / "full" / "lb_qa"
    (task / "long").mkdir()
    Cell(run_dir, "m", "full", "lb_qa", 1024).metrics_path.rename(task / "long" / "metrics.json")  # not a length
    assert cli.main(["report", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "is not a cell folder (<model>/<method>/<task>/<length>" in err and err.count("\n") == 1
