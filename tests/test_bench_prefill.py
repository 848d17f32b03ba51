"""``elastic-bench bench prefill``: every method's record, the floor and the ideal, the seeded head splits, the warm-up
kept out of the timings, the timed forwards taken in rounds, errors recorded per method, inputs checked before the
model loads."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import torch
from fixtures.clock import FakeClock

from elastic_bench.bench import prefill
from elastic_bench.bench.prefill import METHODS, PrefillBenchConfig, SeededModes, add_ratios, ideal_speedup
from elastic_bench.cli import main
from elastic_bench.kernels import hybrid
from elastic_bench.kernels.hybrid.naive import naive_hybrid_attention

APPLIED = [m for m in METHODS if m not in ("floor", "sdpa")]  # the methods run through `apply`
LAYERS, KV_HEADS = 2, 2  # tiny:llama


def _bench(tmp_path, *argv: str) -> tuple[int, dict]:
    out = tmp_path / "prefill.json"
    rc = main(["bench", "prefill", "--model", "tiny:llama", "--device", "cpu", "--repeats", "1", "--no-progress",
               "--output", str(out), *argv])
    return rc, json.loads(out.read_text()) if out.exists() else {}


def test_every_method_has_its_record_beside_full_and_the_floor(tmp_path, capsys):
    rc, report = _bench(tmp_path, "--lengths", "256,512", "--methods", ",".join([*APPLIED, "sdpa"]), "--router",
                        "untrained", "--density", "0.5")
    assert rc == 0
    assert {"provenance", "command", "device", "config", "results"} <= report.keys()
    assert report["config"]["omega_msr"] == 0.7 and report["device"] == "cpu"
    rows = {(r["method"], r["length"]): r for r in report["results"]}
    assert set(rows) == {(m, n) for m in METHODS for n in (256, 512)}
    for (method, _), r in rows.items():
        assert "error" not in r, r
        assert r["median_s"] > 0 and r["mean_s"] > 0 and len(r["times_s"]) == 1
        for key in ("speedup_vs_full", "ideal_speedup", "fraction_of_ideal", "omega_msr", "omega_esr"):
            assert r[key] is not None, (method, key)
        if method in APPLIED:
            assert r["routing_seconds"] > 0 and 0 < r["routing_fraction"] < 1
            assert r["prefill_backends"] == {"masked": LAYERS}  # one timed forward, each layer on the CPU path
    for length in (256, 512):
        full, floor = rows[("full", length)], rows[("floor", length)]
        assert full["speedup_vs_full"] == full["ideal_speedup"] == full["fraction_of_ideal"] == 1.0
        assert floor["omega_esr"] == 1.0
        assert floor["ideal_speedup"] == pytest.approx(full["median_s"] / floor["median_s"])
        assert floor["fraction_of_ideal"] == pytest.approx(1.0)
        # fa-ssa: round(ΩMSR · L · H) heads on the sparse side, within one head of the requested share
        assert abs(rows[("fa-ssa", length)]["omega_msr"] - 0.7) <= 1 / (LAYERS * KV_HEADS)
        assert rows[("fa-ssa", length)]["omega_msr"] == round(0.7 * LAYERS * KV_HEADS) / (LAYERS * KV_HEADS)
        assert rows[("xa-ssa", length)]["omega_msr"] == 1.0  # its full side is XAttention
        for mode in ("fa-xa", "xa-ssa"):
            assert rows[(mode, length)]["estimation_seconds"] > 0
            assert 0 < rows[(mode, length)]["block_density"] <= 1
        assert 0 < rows[("xattention", length)]["block_density"] <= 1
        assert "estimation_seconds" not in rows[("fa-ssa", length)]
        assert rows[("elastic", length)]["mode"] == "fa-ssa"
    # at 512 tokens (4 blocks) the random blocks at density 0.5 drop some causal blocks of the fa-xa heads
    assert rows[("fa-xa", 512)]["block_density"] < 1 and rows[("fa-xa", 512)]["omega_esr"] > 0
    table = capsys.readouterr().out
    assert "ideal%" in table and "fa-xa" in table and "block density" in table and "results:" in table
    assert f"source digest {report['provenance']['source_digest']}" in table  # the provenance footer


def test_the_warm_up_forward_is_not_timed(tmp_path, monkeypatch):
    """A backend whose first call at each key length is slow (a kernel compiling) costs the warm-up forward only: on
    a clock that advances by what the backend costs, each timed forward is the cost of its own calls, one per layer."""
    compiling, call = 100.0, 0.01  # seconds the stub costs: its first call at a key length, every other call
    clock, slept = FakeClock(), set()
    monkeypatch.setattr(time, "perf_counter", clock)

    def slow_first(q, k, v, plan, scale):
        clock.spend(call if k.shape[2] in slept else compiling)
        slept.add(k.shape[2])
        return naive_hybrid_attention(q, k, v, plan, scale)

    monkeypatch.setattr(hybrid, "_BACKENDS", dict(hybrid._BACKENDS))
    hybrid.register_backend("stub_slow_first", slow_first, lambda device: device.type == "cpu", 100)
    rc, report = _bench(tmp_path, "--lengths", "256,384", "--methods", "full,streaming", "--backend",
                        "stub_slow_first", "--repeats", "2")
    assert rc == 0 and slept == {256, 384}
    timed = [r for r in report["results"] if r["method"] in ("full", "streaming")]
    assert len(timed) == 4
    for r in timed:  # plus a few microseconds of the clock's own readings
        assert r["times_s"] == pytest.approx([LAYERS * call] * 2, abs=1e-4), r
        assert r["median_s"] == pytest.approx(LAYERS * call, abs=1e-4)
        assert r["prefill_backends"] == {"stub_slow_first": 2 * LAYERS}


def test_timed_forwards_take_turns_round_by_round(tmp_path, monkeypatch):
    """Every method's warm-up first, then one timed forward per method per round: a drift of the device over the
    sweep reaches every method alike. A method failing in a round leaves the rounds with its error recorded."""
    calls, forward = [], prefill._Entry.forward

    def logged(entry, index):
        calls.append((entry.name, index))
        if entry.name == "streaming" and index == 1:
            raise RuntimeError("out of memory (stub)")
        forward(entry, index)

    monkeypatch.setattr(prefill._Entry, "forward", logged)
    rc, report = _bench(tmp_path, "--lengths", "256", "--methods", "streaming,fa-ssa", "--repeats", "3")
    assert rc == 0
    names = ["floor", "full", "streaming", "fa-ssa"]
    assert calls == [(n, None) for n in names] + [(n, 0) for n in names] + [(n, 1) for n in names] \
        + [(n, 2) for n in names if n != "streaming"]
    rows = {r["method"]: r for r in report["results"]}
    assert "out of memory (stub)" in rows["streaming"]["error"] and "median_s" not in rows["streaming"]
    assert len(rows["fa-ssa"]["times_s"]) == 3 and rows["fa-ssa"]["prefill_backends"] == {"masked": 3 * LAYERS}
    assert rows["fa-ssa"]["omega_msr"] == round(0.7 * LAYERS * KV_HEADS) / (LAYERS * KV_HEADS)


def test_random_blocks_are_drawn_in_the_warm_up_only(tmp_path, monkeypatch):
    """The timed forwards, each in a context of its own, reuse the warm-up's random blocks (drawn once per layer)."""
    from elastic_bench.kernels import bench as kernel_bench

    draws, draw = [], kernel_bench.random_blocks
    monkeypatch.setattr(kernel_bench, "random_blocks", lambda *args: draws.append(args[1]) or draw(*args))
    rc, _ = _bench(tmp_path, "--lengths", "256,384", "--methods", "fa-xa", "--density", "0.5", "--repeats", "3")
    assert rc == 0 and draws == [256] * LAYERS + [384] * LAYERS


def test_a_failing_method_is_recorded_and_the_sweep_goes_on(tmp_path):
    gates = tmp_path / "full_attention_heads.tsv"
    gates.write_text("0.1\t0.2\t0.3\n0.4\t0.5\t0.6\n0.7\t0.8\t0.9\n")  # 3 × 3: not the model's 2 layers × 2 heads
    rc, report = _bench(tmp_path, "--lengths", "256", "--methods", "duo_attention,streaming", "--pattern", str(gates))
    assert rc == 0
    rows = {r["method"]: r for r in report["results"]}
    assert "3 layers × 3 KV heads" in rows["duo_attention"]["error"] and "median_s" not in rows["duo_attention"]
    assert rows["streaming"]["median_s"] > 0 and rows["streaming"]["speedup_vs_full"] > 0


def test_seeded_modes_put_the_requested_share_of_heads_on_the_sparse_side(tiny_models):
    model, _ = tiny_models["llama"]
    splits = []
    for omega in (0.0, 0.25, 0.5, 0.7, 1.0):
        method = SeededModes(mode="fa-ssa", omega_msr=omega, seed=3)
        method.setup(model)
        assert method.full_side.shape == (LAYERS, KV_HEADS)
        assert int((~method.full_side).sum()) == round(omega * LAYERS * KV_HEADS)
        splits.append(method.full_side)
    again = SeededModes(mode="fa-ssa", omega_msr=0.5, seed=3)
    again.setup(model)
    assert torch.equal(again.full_side, splits[2])  # the split is a function of the seed


def _records() -> list[dict]:
    return [{"method": "floor", "median_s": 2.0, "attention_share": 0.0}, {"method": "sdpa", "median_s": 8.0,
            "attention_share": 1.0}, {"method": "full", "median_s": 10.0, "attention_share": 1.0},
            {"method": "streaming", "median_s": 5.0, "attention_share": 0.5}, {"method": "xattention", "error": "OOM"}]


def test_ratios_follow_the_floor_and_full():
    assert ideal_speedup(10.0, 2.0, 1.0) == 1.0 and ideal_speedup(10.0, 2.0, 0.0) == 5.0
    assert ideal_speedup(10.0, 2.0, 0.5) == pytest.approx(10 / 6)
    records = _records()
    add_ratios(records)
    streaming = records[3]
    assert streaming["speedup_vs_full"] == 2.0 and streaming["speedup_vs_sdpa"] == 1.6
    assert streaming["fraction_of_ideal"] == pytest.approx(2.0 / (10 / 6))
    assert "speedup_vs_full" not in records[4]
    without_full = [r for r in _records() if r["method"] != "full"]  # full failed: no ratio against it
    add_ratios(without_full)
    assert not any("speedup_vs_full" in r or "fraction_of_ideal" in r for r in without_full)
    assert without_full[2]["speedup_vs_sdpa"] == 1.6


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--methods", "full,bogus"], "unknown method(s) bogus; valid: floor, full, sdpa"),
        (["--lengths", "0"], "lengths must be positive"),
        (["--omega-msr", "1.5"], "omega_msr must lie in [0, 1]"),
        (["--density", "0"], "density must lie in (0, 1]"),
        (["--methods", "elastic"], "needs --router"),
        (["--router", "/no/such/router"], "not a directory"),
        (["--pattern", "/no/such/gates.tsv"], "--pattern: no file"),
        (["--backend", "bogus"], "unknown attention backend 'bogus'"),
        (["--repeats", "0"], "repeats must be >= 1"),
    ],
)
def test_bad_input_ends_in_one_line_before_the_model_loads(argv, message, tmp_path, monkeypatch, capsys):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr("elastic_bench.modeling.loading.load_model", no_model)
    rc, _ = _bench(tmp_path, "--lengths", "256", *argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1, err


def test_help_lists_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "prefill", "--help"])
    out = capsys.readouterr().out
    for f in dataclasses.fields(PrefillBenchConfig):
        assert "--" + f.name.replace("_", "-") in out, f.name
    assert "fa-ssa" in out and "floor" in out


def test_a_router_adds_the_elastic_method():
    assert PrefillBenchConfig(methods=["full"], router="untrained").methods == ["full", "elastic"]
    assert prefill.REFERENCES == ("floor", "full")


def test_method_options_set_the_knobs_of_the_registered_methods(tmp_path, capsys):
    knobs = "infllm_v2.dense_len=0,infllm_v2.topk=2,infllm_v2.window_size=64,moba.chunk_size=128,moba.topk=2"
    rc, report = _bench(tmp_path, "--lengths", "512", "--methods", "infllm_v2,moba", "--method-options", knobs)
    assert rc == 0
    rows = {r["method"]: r for r in report["results"]}
    assert rows["infllm_v2"]["options"]["topk"] == 2 and rows["moba"]["options"]["chunk_size"] == 128
    for name in ("infllm_v2", "moba"):  # sparse, and the selection's time is the routing time
        assert rows[name]["block_density"] < 1 and rows[name]["omega_esr"] > 0 and rows[name]["routing_seconds"] > 0
    for bad, message in (("moba.topk=2", "'moba' is not a registered method of --methods (infllm_v2)"),
                         ("infllm_v2.topkk=2", "did you mean topk?"), ("infllm_v2", "METHOD.OPTION=VALUE")):
        rc, _ = _bench(tmp_path / bad.replace("=", "_"), "--methods", "infllm_v2", "--method-options", bad)
        assert rc == 2 and message in capsys.readouterr().err
