"""What ran is what is recorded: a cell records the kernel backend its prefills actually used, also where the prompts
(fitted to length − max_new_tokens) fall below a backend's key-length threshold that the cell's length passes."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import torch
from fixtures.clock import FakeClock

from elastic_bench.evaluation.runner import RunConfig, run
from elastic_bench.kernels import hybrid
from elastic_bench.kernels.hybrid.naive import naive_hybrid_attention

THRESHOLD = 700  # keys from which `auto` prefers the stub backend on the CPU


def _cell_metrics(output, method: str, length: int) -> tuple[dict, list[dict]]:
    cell = output / "tiny-qwen3" / method / "ruler_niah_single_1" / str(length)
    predictions = [json.loads(line) for line in (cell / "predictions.jsonl").read_text().splitlines()]
    return json.loads((cell / "metrics.json").read_text()), predictions


def test_recorded_backend_is_the_one_that_ran(tmp_path, monkeypatch):
    ran: list[tuple[str, int]] = []  # (backend, keys) of every prefill call

    def recording(name, fn):
        def call(q, k, v, plan, scale):
            if q.shape[2] == k.shape[2]:
                ran.append((name, k.shape[2]))
            return fn(q, k, v, plan, scale)

        return call

    monkeypatch.setattr(hybrid, "_BACKENDS", {"reference": hybrid._BACKENDS["reference"]})  # the stub above it only
    hybrid.register_backend("reference", recording("reference", naive_hybrid_attention), lambda device: True, 0)
    hybrid.register_backend("stub_long", recording("stub_long", naive_hybrid_attention),
                            lambda device: device.type == "cpu", 100, prefer=lambda keys: keys >= THRESHOLD)
    assert hybrid.resolve_backend("auto", "cpu", 768) == "stub_long"  # what the cell's length alone would suggest

    config = RunConfig(methods=["full"], tasks=["ruler_niah_single_1"], lengths=[768, 2048], limit=2,
                       output=str(tmp_path / "run"), device="cpu", progress=False)
    run(config)
    short, short_predictions = _cell_metrics(tmp_path / "run", "full", 768)
    long, long_predictions = _cell_metrics(tmp_path / "run", "full", 2048)

    assert all(r["input_tokens"] < THRESHOLD for r in short_predictions)  # 768 − 128 new tokens at most
    assert short["backend_used"] == "reference" and "backend_counts" not in short
    assert long["backend_used"] == "stub_long"
    assert [r["backend"] for r in short_predictions] == ["reference"] * 2
    assert [r["backend"] for r in long_predictions] == ["stub_long"] * 2
    layers = 2  # tiny:qwen3
    expected = []
    for backend, predictions in (("reference", short_predictions), ("stub_long", long_predictions)):
        warm_up = [predictions[0]]  # the untimed forward before the cell's first timed prefill
        expected += [(backend, r["input_tokens"]) for r in warm_up + predictions for _ in range(layers)]
    assert ran == expected


def test_a_cell_whose_prompts_straddle_a_threshold_counts_each_backend(tmp_path, monkeypatch):
    monkeypatch.setattr(hybrid, "_BACKENDS", {"reference": hybrid._BACKENDS["reference"]})  # the stub above it only
    config = RunConfig(methods=["full"], tasks=["ruler_niah_single_1"], lengths=[768], limit=3,
                       output=str(tmp_path / "run"), device="cpu", progress=False)
    run(config)
    _, predictions = _cell_metrics(tmp_path / "run", "full", 768)
    lengths = sorted(r["input_tokens"] for r in predictions)
    assert lengths[0] < lengths[-1], "the fixture needs prompts of different lengths"
    cut = lengths[-1]  # the longest prompt alone reaches the stub's threshold
    hybrid.register_backend("stub_long", naive_hybrid_attention, lambda device: device.type == "cpu", 100,
                            prefer=lambda keys: keys >= cut)
    run(dataclasses.replace(config, output=str(tmp_path / "again")))
    metrics, predictions = _cell_metrics(tmp_path / "again", "full", 768)
    backends = {r["input_tokens"]: r["backend"] for r in predictions}
    assert all(b == ("stub_long" if n >= cut else "reference") for n, b in backends.items())
    counts = {"stub_long": sum(n >= cut for n in lengths), "reference": sum(n < cut for n in lengths)}
    assert metrics["backend_counts"] == counts
    assert metrics["backend_used"] == max(counts, key=counts.get)


@pytest.mark.gpu
def test_on_cuda_a_32k_cell_records_the_single_launch_its_prompts_ran(tmp_path):
    """At 32K tokens ``auto`` would take ``split`` for the length, but the prompts are 32K − 128 tokens long: below
    `SPLIT_MIN_KEYS`, where ``auto`` runs the single Triton launch."""
    from elastic_bench.kernels.hybrid.fused import SPLIT_MIN_KEYS

    assert torch.cuda.is_available()
    config = RunConfig(methods=["full"], tasks=["ruler_niah_single_1"], lengths=[SPLIT_MIN_KEYS, SPLIT_MIN_KEYS + 512],
                       limit=1, output=str(tmp_path / "run"), progress=False)
    run(config)
    below, below_predictions = _cell_metrics(tmp_path / "run", "full", SPLIT_MIN_KEYS)
    above, above_predictions = _cell_metrics(tmp_path / "run", "full", SPLIT_MIN_KEYS + 512)
    assert below_predictions[0]["input_tokens"] < SPLIT_MIN_KEYS <= above_predictions[0]["input_tokens"]
    assert below["backend_used"] == "triton" and above["backend_used"] == "split"


def test_the_warm_up_prefill_is_not_timed(tmp_path, monkeypatch):
    """A backend whose first call is slow (as a compiled kernel's is) costs the warm-up forward, never a timed
    prefill: on a clock that advances by what the backend costs, every sample's prefill, the cell's median and mean
    are the cost of the prefill's own calls, one per layer."""
    compiling, call = 100.0, 0.01  # seconds the stub costs: its first call, every other call
    clock, calls = FakeClock(), []
    monkeypatch.setattr(time, "perf_counter", clock)

    def slow_first(q, k, v, plan, scale):
        clock.spend(call if calls else compiling)
        calls.append(k.shape[2])
        return naive_hybrid_attention(q, k, v, plan, scale)

    monkeypatch.setattr(hybrid, "_BACKENDS", dict(hybrid._BACKENDS))
    hybrid.register_backend("compiled_stub", slow_first, lambda device: device.type == "cpu", 100)
    config = RunConfig(methods=["full"], tasks=["ruler_niah_single_1"], lengths=[640], limit=2,
                       output=str(tmp_path / "run"), device="cpu", progress=False)
    run(config)
    metrics, predictions = _cell_metrics(tmp_path / "run", "full", 640)
    assert metrics["backend_used"] == "compiled_stub"
    layers = 2  # tiny:qwen3: the untimed forward ran first, over the first sample's prompt
    assert calls[:layers] == [predictions[0]["input_tokens"]] * layers
    prefill = layers * call  # plus a few microseconds of the clock's own readings
    assert [r["prefill_seconds"] for r in predictions] == pytest.approx([prefill] * 2, abs=1e-4)
    assert metrics["prefill_seconds_median"] == pytest.approx(prefill, abs=1e-4)
    assert metrics["prefill_seconds"] == pytest.approx(prefill, abs=1e-4)
