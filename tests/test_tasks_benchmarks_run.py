"""End to end: `elastic-bench run` on tiny:llama runs every task of NoLiMa, BABILong, MRCR, GraphWalks, HELMET (at
4096 tokens, HELMET's shortest length), LongBench Pro (at 8192, its shortest label) and RULER v2 from the generated
fixtures, one sample each, and writes scored cells.

A random model never emits its end token, so every answer would use the whole budget (MRCR's is the rest of the
length, GraphWalks' and LongBench Pro's 1,024 tokens): generation is capped at 4 new tokens here, through the real
decoding of the real model."""

from __future__ import annotations

import json
import math

import pytest
from fixtures.benchmarks_data import build

from elastic_bench import tasks
from elastic_bench.cli import main
from elastic_bench.modeling import generation

CAP = 4


@pytest.fixture
def short_answers(monkeypatch, offline_hub):
    original = generation.greedy_generate

    def capped(model, input_ids, max_new_tokens, *args, **kwargs):
        return original(model, input_ids, min(max_new_tokens, CAP), *args, **kwargs)

    monkeypatch.setattr(generation, "greedy_generate", capped)


@pytest.mark.slow
def test_run_every_new_task_on_tiny_llama(tmp_path, short_answers):
    data, out = build(tmp_path / "data"), tmp_path / "runs"
    common = ["--model", "tiny:llama", "--methods", "full", "--limit", "1", "--data-dir", str(data), "--output",
              str(out), "--no-progress", "--device", "cpu", "--dtype", "float32"]
    assert main(["run", "--tasks", "nolima,babilong_10,mrcr,graphwalks,helmet", "--lengths", "4096", *common]) == 0
    assert main(["run", "--tasks", "longbench_pro", "--lengths", "8192", *common]) == 0
    names = tasks.expand(["nolima", "babilong_10", "mrcr", "graphwalks", "helmet", "longbench_pro"])
    for name in names:
        length = 8192 if name == "longbench_pro" else 4096
        cell = out / "tiny-llama" / "full" / name / str(length)
        metrics = json.loads((cell / "metrics.json").read_text())
        assert metrics["status"] == "complete" and metrics["num_samples"] == 1, name
        assert 0 <= metrics["score"] <= 100 and not math.isnan(metrics["score"]), name
        (record,) = [json.loads(x) for x in (cell / "predictions.jsonl").read_text().splitlines()]
        assert record["metadata"]["category"] in ("sensitive", "robust") and 0 <= record["score"] <= 1, name
    assert len(names) == 33


@pytest.mark.slow
def test_run_every_ruler2_task_on_tiny_llama(tmp_path, short_answers):
    """RULER v2's 12 tasks at 3072 tokens, the shortest length all of them fit with the fixture (four or five copied
    questions take a 2,048-token budget)."""
    data, out = build(tmp_path / "data"), tmp_path / "runs"
    assert main(["run", "--model", "tiny:llama", "--methods", "full", "--limit", "1", "--data-dir", str(data),
                 "--output", str(out), "--no-progress", "--device", "cpu", "--dtype", "float32", "--tasks", "ruler2",
                 "--lengths", "3072"]) == 0
    for name in tasks.expand(["ruler2"]):
        metrics = json.loads((out / "tiny-llama" / "full" / name / "3072" / "metrics.json").read_text())
        assert metrics["status"] == "complete" and metrics["num_samples"] == 1, name
        assert 0 <= metrics["score"] <= 100, name
