"""The benchmarks' regression guard (`--baseline`): every cell more than --tolerance slower than the baseline's on the
same device is flagged with both figures, recorded and ends the command with status 1; a bad baseline is one line
before anything runs; another device's baseline is not compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elastic_bench.bench.regression import RegressionConfig, cells, compare
from elastic_bench.cli import main

KERNEL = ["bench", "kernel", "--lengths", "256", "--cells", "three-way", "--backends", "reference", "--query-heads",
          "4", "--kv-heads", "2", "--head-dim", "16", "--dtype", "float32", "--repeats", "2", "--no-progress"]


def _report(device, *records):
    return {"provenance": {"device": device}, "results": list(records)}


def test_a_cell_slower_than_the_tolerance_is_flagged_with_both_figures():
    before = _report("NVIDIA H200", {"length": 1024, "cell": "dense", "backend": "sdpa", "ms": 1.0},
                     {"length": 1024, "cell": "three-way", "backend": "triton", "ms": 2.0},
                     {"length": 1024, "method": "full", "median_s": 0.5})
    now = _report("NVIDIA H200", {"length": 1024, "cell": "dense", "backend": "sdpa", "ms": 1.049},  # within 5%
                  {"length": 1024, "cell": "three-way", "backend": "triton", "ms": 2.2},  # 10% slower
                  {"length": 1024, "method": "full", "median_s": 0.4},  # faster
                  {"length": 2048, "method": "full", "median_s": 9.0})  # no baseline cell
    flagged, summary = compare(now, before, 0.05)
    assert [(r.key, r.before, r.now) for r in flagged] == [
        ({"length": 1024, "cell": "three-way", "backend": "triton"}, 2.0, 2.2)]
    assert flagged[0].ratio == pytest.approx(1.1)
    assert "3 cells compared" in summary and "1 more than 5% slower" in summary and "1 without a baseline" in summary
    assert compare(now, before, 0.2)[0] == []
    other, why = compare(_report("NVIDIA H100"), before, 0.05)
    assert other == [] and "not compared" in why and "NVIDIA H100" in why
    assert len(cells({"results": [{"length": 1, "error": "OOM"}]})) == 0  # a failed cell has no time


def test_bench_kernel_with_its_own_result_as_baseline_and_a_faster_one(tmp_path, capsys):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    assert main([*KERNEL, "--output", str(first)]) == 0
    capsys.readouterr()
    assert main([*KERNEL, "--output", str(second), "--baseline", str(first), "--tolerance", "9"]) == 0
    out = capsys.readouterr().out
    assert "regression guard: 2 cells compared" in out and "0 more than 900% slower" in out
    faster = json.loads(first.read_text())  # a baseline a thousand times faster: every cell is flagged
    for record in faster["results"]:
        record["ms"] /= 1000
    (tmp_path / "fast.json").write_text(json.dumps(faster))
    assert main([*KERNEL, "--output", str(second), "--baseline", str(tmp_path / "fast.json")]) == 1
    out = capsys.readouterr().out
    recorded = json.loads(second.read_text())["regressions"]
    assert len(recorded["cells"]) == 2 and recorded["tolerance"] == 0.05 and "slower by" in out
    assert all(c["now"] > 1000 * c["baseline"] * 0.5 for c in recorded["cells"])


@pytest.mark.parametrize("content, message", [(None, "cannot read --baseline"), ("{", "is not a result JSON"),
                                              ('{"results": 3}', "holds no results list")])
def test_a_bad_baseline_is_one_line_before_the_bench_runs(tmp_path, capsys, content, message):
    baseline = tmp_path / "baseline.json"
    if content is not None:
        baseline.write_text(content)
    out = tmp_path / "out.json"
    assert main([*KERNEL, "--output", str(out), "--baseline", str(baseline)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("shipped", sorted((Path(__file__).resolve().parents[1] / "docs" / "bench").glob("*.json")),
                         ids=lambda p: p.name)
def test_the_shipped_h200_baselines_load_and_hold_against_themselves(shipped):
    baseline = RegressionConfig(baseline=str(shipped)).load()
    assert baseline["provenance"]["device"] == "NVIDIA H200"
    flagged, said = compare(baseline, baseline, 0.05)
    assert flagged == [] and said.startswith(f"{len(cells(baseline))} cells compared") and len(cells(baseline)) >= 4
