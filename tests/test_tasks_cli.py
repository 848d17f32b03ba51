"""End to end: `elastic-bench run` on LongBench-E, LongBench-v2 and RULER fixtures with tiny:llama writes per-bucket
and per-breakdown metrics; `elastic-bench tasks` lists the groups; a missing corpus fails its cell with a clear
error."""

from __future__ import annotations

import json
import math
import re

import pytest
from fixtures.tasks_data import build

from elastic_bench.cli import main


@pytest.mark.slow
def test_run_longbench_e_v2_and_ruler(tmp_path, capsys):
    data = build(tmp_path / "data")
    out = tmp_path / "runs"
    tasks = "longbench_e_hotpotqa,longbench_v2,ruler_vt"
    argv = ["run", "--model", "tiny:llama", "--methods", "full", "--tasks", tasks,
            "--lengths", "2048", "--limit", "3", "--data-dir", str(data), "--output", str(out), "--no-progress",
            "--device", "cpu", "--dtype", "float32"]
    assert main(argv) == 0
    cells = out / "tiny-llama" / "full"
    e = json.loads((cells / "longbench_e_hotpotqa" / "2048" / "metrics.json").read_text())
    assert e["status"] == "complete" and e["num_samples"] == 3
    assert all(0 <= e[k] <= 100 for k in ("score", "score_0-4k", "score_4-8k", "score_8k+"))
    v2 = json.loads((cells / "longbench_v2" / "2048" / "metrics.json").read_text())
    assert v2["num_samples"] == 3
    assert {"score", "score_easy", "score_hard", "score_short", "score_medium", "score_long", "num_failed"} <= set(v2)
    vt = json.loads((cells / "ruler_vt" / "2048" / "metrics.json").read_text())
    assert vt["num_samples"] == 3 and not math.isnan(vt["score"])
    records = [json.loads(x) for x in (cells / "ruler_vt" / "2048" / "predictions.jsonl").read_text().splitlines()]
    assert all(r["input_tokens"] + 30 <= 2048 and len(r["references"]) == 5 for r in records)


def test_tasks_listing_and_missing_corpus(tmp_path, capsys):
    assert main(["tasks"]) == 0
    listing = capsys.readouterr().out
    for row in (r"longbench\s+21", r"longbench_e\s+13", r"longbench_v2\s+1", r"ruler\s+13", r"ruler_qa_2\s",
                r"longbench_e_repobench-p\s", r"longbench_v2_cot\s"):
        assert re.search(rf"^{row}", listing, re.MULTILINE), row
    out = tmp_path / "runs"
    argv = ["run", "--model", "tiny:qwen3", "--methods", "full", "--tasks", "ruler_niah_single_2", "--lengths", "1024",
            "--limit", "1", "--data-dir", str(tmp_path), "--output", str(out), "--no-progress", "--device", "cpu"]
    assert main(argv) == 1
    metrics = json.loads((out / "tiny-qwen3" / "full" / "ruler_niah_single_2" / "1024" / "metrics.json").read_text())
    assert metrics["status"] == "failed" and str(tmp_path / "ruler/PaulGrahamEssays.json") in metrics["error"]


def test_runner_generates_a_follow_up_turn_for_chain_of_thought(tmp_path, monkeypatch):
    """longbench_v2_cot: the reasoning turn's prediction feeds the answer turn; the record keeps both."""
    from elastic_bench.evaluation.runner import RunConfig, run
    from elastic_bench.modeling import generation
    from elastic_bench.modeling.loading import byte_tokenizer

    tok, original = byte_tokenizer(), generation.greedy_generate
    scripted, seen = ["Because A fits.", "The correct answer is (A)"], []

    def scripted_generate(model, input_ids, max_new_tokens, stop_ids, min_new_tokens=0, **options):
        seen.append((tok.decode(input_ids), max_new_tokens))
        result = original(model, input_ids, 2, stop_ids, min_new_tokens, **options)  # a real forward for the stats
        result.tokens = tok.encode(scripted[len(seen) - 1], add_special_tokens=False)
        return result

    monkeypatch.setattr(generation, "greedy_generate", scripted_generate)
    config = RunConfig(model="tiny:qwen3", methods=["full"], tasks=["longbench_v2_cot"], lengths=[4096], limit=1,
                       data_dir=str(build(tmp_path / "data")), output=str(tmp_path / "runs"), device="cpu",
                       progress=False)
    assert run(config)[0]["status"] == "complete"
    assert [n for _, n in seen] == [1024, 128]
    assert "Let’s think step by step: Because A fits.\n\nBased on the above" in seen[1][0]
    cell = tmp_path / "runs" / "tiny-qwen3" / "full" / "longbench_v2_cot" / "4096"
    record = json.loads((cell / "predictions.jsonl").read_text())
    assert record["earlier_turns"] == ["Because A fits."] and record["prediction"] == "The correct answer is (A)"
    assert record["score"] == 1.0 and record["metadata"]["cot"] == "Because A fits."
    assert json.loads((cell / "metrics.json").read_text())["score"] == 100.0
