"""``elastic-bench bench decode`` and the decode figures of a run, on a tiny model on the CPU."""

from __future__ import annotations

import json

import pytest

from elastic_bench.cli import main


def _bench(tmp_path, *argv: str) -> tuple[int, dict]:
    out = tmp_path / "decode.json"
    rc = main(["bench", "decode", "--model", "tiny:llama", "--device", "cpu", "--warmup", "1", "--steps", "3",
               "--no-progress", "--output", str(out), *argv])
    return rc, json.loads(out.read_text()) if out.exists() else {}


def test_every_method_and_cache_has_its_row_beside_sdpa(tmp_path, capsys):
    rc, report = _bench(tmp_path, "--lengths", "1200", "--methods", "full,duo_attention,streaming", "--omega-msr",
                        "0.5")
    assert rc == 0 and {"provenance", "command", "config", "results", "bandwidth_gbs"} <= report.keys()
    rows = {(r["method"], r["kv_cache"]): r for r in report["results"]}
    assert set(rows) == {("sdpa", "dynamic")} | {(m, c) for m in ("full", "duo_attention", "streaming")
                                                 for c in ("dynamic", "full", "evicting")}
    assert all("error" not in r and r["median_ms"] > 0 and len(r["times_ms"]) == 3 for r in rows.values())
    assert rows[("full", "evicting")]["kv_bytes"] == rows[("full", "full")]["kv_bytes"]  # nothing to evict
    duo = rows[("duo_attention", "evicting")]
    # half the heads keep sink 64 + window 256 of 1203 tokens; the other half all of them plus room to grow
    assert duo["omega_msr"] == 0.5 and duo["kv_bytes"] < 0.75 * rows[("duo_attention", "full")]["kv_bytes"]
    assert rows[("duo_attention", "dynamic")]["kv_ratio"] == 1.0
    assert "speedup_vs_sdpa" in duo and "speedup_vs_full_cache" in duo
    table = capsys.readouterr().out
    assert "ms/token" in table and f"source digest {report['provenance']['source_digest']}" in table


def test_bad_inputs_exit_2_before_the_model_loads(tmp_path, capsys):
    for argv in (["--methods", "ful"], ["--kv-caches", "paged"], ["--omega-msr", "2"], ["--lengths", "1"],
                 ["--methods", "elastic"], ["--max-memory", "-1"]):
        rc, report = _bench(tmp_path, *argv)
        assert rc == 2 and not report, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in err[0], err


@pytest.mark.parametrize("kv_cache", ["evicting", "dynamic"])
def test_a_run_records_decode_time_and_cache_bytes(tmp_path, kv_cache):
    from elastic_bench.evaluation.runner import RunConfig, run
    from elastic_bench.results.store import Cell

    config = RunConfig(model="tiny:qwen3", methods=["streaming"], tasks=["ruler_niah_single_1"], lengths=[1024],
                       limit=1, output=str(tmp_path), device="cpu", progress=False, kv_cache=kv_cache,
                       method_options={"streaming": {"sink": 4, "local": 64, "sparse_decode": True}})
    run(config)
    cell = Cell(tmp_path, "tiny-qwen3", "streaming-sink=4-local=64-sparse_decode=True", "ruler_niah_single_1", 1024)
    metrics, (record,) = cell.metrics(), cell.predictions()
    assert metrics["status"] == "complete" and metrics["kv_cache"] == kv_cache
    assert record["decode_ms_per_token"] > 0 and metrics["decode_ms_per_token"] > 0
    if kv_cache == "evicting":
        assert record["kv_bytes"] < 0.2 * record["kv_bytes_full"]
    else:
        assert "kv_bytes" not in record
