"""The report at equal budgets: the calibration table with the budgets out of reach, every method beside full and the
oracle at each budget, the loss taken apart (adding up), and the prefill taken apart with the share of the ideal and
the crossover length (measured, with its bracket); on the CPU the speed figures give way to the sentence that says
why."""

from __future__ import annotations

import numpy as np
import pytest

from elastic_bench.reports import load_cells, summarize, write_report
from elastic_bench.reports.budgets import _crossover, speedup_interval
from elastic_bench.results.store import Cell

PARTS = {"model": 0.0, "routing": 0.0, "estimation": 0.0, "planning": 0.0, "accounting": 0.0, "attention": 0.0}


def _cell(root, method, length, scores, esr, prefill, parts, target=None, error=None, device="NVIDIA H200"):
    """A cell of a budget run as the runner writes it: per-sample scores and prefill times, its parts, its
    calibration record (``target``: its budget; none for full)."""
    cell = Cell(root, "m", method, "ruler_niah_single_1", length)
    cell.dir.mkdir(parents=True, exist_ok=True)
    calibration = {"calibration_ids": {"ruler_niah_single_1": ["0", "1"]}}
    if target is not None:
        calibration |= {"measure": "omega_esr", "target": target, "tolerance": 0.02, "knobs": {"local": 300},
                        "achieved": esr if error is None else 0.76, "within_tolerance": error is None,
                        "evaluations": 6, **({"error": error} if error else {})}
    metrics = {"status": "failed" if error else "complete", "device": device, "backend_used": "split",
               "method": method.split("-")[0], "method_options": {}, "fingerprint": {"method": method},
               "calibration": calibration, "versions": {}, "git_hash": "abc", "source_digest": "d", "date": "2026"}
    if error:
        metrics["error"] = error
    else:
        for i, (score, seconds) in enumerate(zip(scores, prefill)):
            cell.append({"id": str(i + 2), "score": score, "metadata": {}, "omega_msr": 1.0, "omega_esr": esr,
                         "prefill_seconds": seconds, "prefill_parts": parts})
        metrics |= {"score": 100 * float(np.mean(scores)), "omega_msr": 1.0, "omega_esr": esr,
                    "prefill_seconds_median": float(np.median(prefill)), "prefill_parts": parts,
                    "prefill_unexplained": float(np.mean(prefill)) - sum(parts.values())}
    cell.finish(metrics)


@pytest.fixture
def budget_run(tmp_path):
    root = tmp_path / "run"
    rng = np.random.default_rng(0)
    full = [1, 1, 1, 1, 1, 1, 1, 1]
    for length, t_full, t_stream in ((1024, 0.20, 0.26), (8192, 2.0, 1.0)):
        jitter = lambda t: list(t * (1 + 0.01 * rng.standard_normal(8)))  # noqa: E731
        _cell(root, "full", length, full, 0.0, jitter(t_full), PARTS | {"model": t_full / 2, "attention": t_full / 2})
        _cell(root, "oracle-esr=0.5", length, [1, 1, 1, 1, 1, 1, 0, 0], 0.5, jitter(3 * t_full), PARTS
              | {"estimation": 2 * t_full, "attention": t_full / 2, "model": t_full / 2}, target=0.5)
        _cell(root, "streaming-esr=0.5", length, [1, 1, 1, 0, 0, 0, 0, 0], 0.5, jitter(t_stream), PARTS
              | {"model": t_full / 2, "attention": t_stream - t_full / 2}, target=0.5)
        _cell(root, "streaming-esr=0.9", length, [], 0.0, [], PARTS, target=0.9,
              error="ΩESR 0.9 is out of reach: the knobs tried span ΩESR 0.000–0.761 on the calibration prompts")
    return root


def _row(md: str, first: str, after: str) -> list[str]:
    lines = md[md.index(after):].splitlines()
    line = next(x for x in lines if x.startswith("|") and x.strip("|").split("|")[0].strip() == first)
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_the_report_compares_methods_at_equal_budgets_and_takes_the_loss_apart(budget_run, tmp_path):
    out = tmp_path / "report"
    write_report(summarize(load_cells(budget_run)), out, source="budget run")
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    for text in (md, page):
        assert "At equal budgets" in text and "Prefill time taken apart" in text
        assert "ΩESR 0.9 is out of reach" in text and "not a speed figure" in text
    calibration = _row(md, "streaming (esr=0.5)", "Calibration to each budget")
    assert calibration[:7] == ["streaming (esr=0.5)", "1024", "0.500", "local=300", "0.500", "0.500", "yes"]
    assert _row(md, "streaming-esr=0.9", "Calibration to each budget")[6] == "no"  # failed everywhere: its folder
    scores = _row(md, "streaming (esr=0.5)", "Scores at equal budgets")
    # 16 held-out samples (2 lengths × 8): streaming 3 of 8 right, full 8, the oracle 6
    assert scores[1:5] == ["0.500", "0.500", "37.50", "16"] and scores[5] == "-62.50" and scores[7] == "-37.50"
    loss = _row(md, "streaming (esr=0.5)", "Score loss at each budget")
    assert loss[1:3] == ["0.500", "16"] and (loss[3], loss[5], loss[7]) == ("+62.50", "+25.00", "+37.50")
    assert (out / "m-equal-budgets.png").exists() and (out / "m-prefill-parts.png").exists()
    # the speed figures: timed on a GPU, full's prefill at least 100 ms
    share = _row(md, "streaming (esr=0.5)", "Speedup over full and the share of the ideal")
    assert share[1] == "1024" and float(share[2]) < 1
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in md.splitlines() if line.startswith("|")]
    long = next(r for r in rows if r[:2] == ["streaming (esr=0.5)", "8192"] and len(r) == 8)
    speedup, ideal = float(long[2]), float(long[6])
    assert speedup == pytest.approx(2.0, rel=0.03) and ideal == pytest.approx(2.0 / (2.0 - 1.0 * 0.5), rel=0.03)
    assert _row(md, "streaming (esr=0.5)", "Crossover length")[1] == "(1024, 8192]"
    assert _row(md, "oracle (esr=0.5)", "Crossover length")[1] == "not reached by 8192"


def test_on_the_cpu_the_parts_are_shown_and_the_speed_figures_give_way_to_the_reason(tmp_path):
    root = tmp_path / "run"
    for method in ("full", "streaming-esr=0.5"):
        _cell(root, method, 1024, [1, 1], 0.5 if method != "full" else 0.0, [0.3, 0.3],
              PARTS | {"model": 0.2, "attention": 0.1}, target=None if method == "full" else 0.5, device="cpu (x86_64)")
    write_report(summarize(load_cells(root)), tmp_path / "report", source="cpu run")
    md = (tmp_path / "report" / "report.md").read_text()
    parts = _row(md, "full", "Prefill time taken apart (mean")
    assert parts[1:4] == ["1024", "200.00", "0.00"] and float(parts[-1]) == pytest.approx(0.0)  # all explained
    assert "timed on the CPU" in md and "crossover lengths are not shown" in md and "Crossover length" not in md


def test_the_crossover_is_the_start_of_the_last_winning_streak():
    assert _crossover([(1024, 1.5, 1.2, 1.8), (4096, 2.0, 1.8, 2.2)])["crossover"] == "≤ 1024"
    found = _crossover([(1024, 1.2, 1.1, 1.3), (4096, 0.9, 0.8, 1.05), (16384, 1.6, 1.4, 1.8)])
    assert found["crossover"] == "(4096, 16384]" and found["speedup there"] == "1.60 [1.40, 1.80]"
    assert _crossover([(1024, 0.9, 0.8, 1.0), (4096, 1.05, 0.98, 1.1)])["crossover"] == "not reached by 4096"


def test_the_speedup_interval_is_a_paired_bootstrap_of_median_ratios():
    times = np.array([1.0, 1.1, 0.9, 1.05, 0.95])
    ratio, low, high = speedup_interval(2 * times, times)
    assert ratio == pytest.approx(2.0) and low == pytest.approx(2.0) and high == pytest.approx(2.0)  # paired
    ratio, low, high = speedup_interval(times, times[::-1])
    assert ratio == pytest.approx(1.0) and low < 1.0 < high
