"""The shipped testbed checkpoint and a reduced `elastic-bench demo` end to end (CPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from elastic_bench import cli, method_names
from elastic_bench.evaluation.commands import SWEEP_RUN
from elastic_bench.modeling.loading import TESTBED_DIR, load_model
from elastic_bench.testbed.vocab import build

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_shipped_checkpoint_is_small_bf16_and_loads_offline_with_its_tokenizer():
    from safetensors import safe_open

    weights = TESTBED_DIR / "model.safetensors"
    assert weights.stat().st_size <= 16 * 2**20
    with safe_open(weights, "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    model, tokenizer = load_model("testbed", device="cpu")
    assert model.num_parameters() == 6_832_384
    assert tokenizer.get_vocab() == build().index  # the shipped tokenizer is the one the generators build
    record = json.loads((TESTBED_DIR / "TRAINING.json").read_text())
    assert record["complete"] and record["command"].startswith("elastic-bench testbed train")


def test_reduced_demo_runs_every_method_on_the_testbed(tmp_path, capsys):
    output = tmp_path / "demo"
    torch.set_num_threads(2)  # the demo runs on the one thread it was measured fastest on, whatever torch's default
    try:
        assert cli.main(["demo", "--output", str(output), "--limit", "1", "--lengths", "1K"]) == 0
    finally:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
    assert threads == 1
    printed = capsys.readouterr().out
    assert f"demo results written to {output}" in printed
    metrics = {p.parent.parent.parent.name.split("-")[0] + "/" + p.parent.parent.name: json.loads(p.read_text())
               for p in output.glob("testbed/*/*/*/metrics.json")}
    shown = set(method_names()) - {"oracle", "nsa"}  # a budget's reference; NSA left out for time
    assert {key.split("/")[0] for key in metrics} == shown
    assert all(m["status"] == "complete" for m in metrics.values())
    # the testbed's story: full attention finds the needle, all-streaming (window 256) loses it at 1K+
    assert metrics["full/testbed_niah_single"]["score"] == 100.0
    assert metrics["streaming/testbed_niah_single"]["omega_msr"] == 1.0
    assert metrics["streaming/testbed_niah_recent"]["score"] == 100.0
    # the shipped router was trained on the testbed's own four generators, which the demo scores: allowed, and every
    # elastic cell names what its router shares with the task (the terminal table marks it); full loads no file
    from elastic_bench import tasks

    for key, cell in metrics.items():
        method, task = key.split("/")
        assert cell["allow_in_distribution"] is True
        if method == "elastic":
            shared = sorted(tasks.REGISTRY.get(task).identities)
            assert cell["in_distribution"] == [{"artifact": "router", "shared": shared}]
            assert cell["artifact_provenance"]["router"]["data"]["records"] == 768
        elif method == "prulong":  # its masks were trained on the same records
            shared = sorted(tasks.REGISTRY.get(task).identities)
            assert cell["in_distribution"] == [{"artifact": "pattern", "shared": shared}]
        elif method == "duo_attention":  # trained on passkeys: held out, its provenance known
            assert cell["in_distribution"] == []
            assert cell["artifact_provenance"]["pattern"]["data"]["identities"] == ["generator:duo.passkey"]
        elif method in ("full", "streaming", "xattention"):
            assert cell["in_distribution"] == [] and cell["artifact_provenance"] == {}
    for method, marks in (("elastic", {"‡"}), ("prulong", {"‡"}), ("duo_attention", set())):  # the rows' last column
        rows = [line.split() for line in printed.splitlines() if line.startswith(f"testbed  {method} ")]
        assert len(rows) == 4 and {row[-1] for row in rows if row[-1] in ("†", "‡", "?")} == marks
    # the demo renders its report: every method in the table, full on both frontiers (the best score at ΩESR 0)
    report = (output / "report" / "report.md").read_text()
    assert all(f"| {name}" in report for name in shown)
    assert "Pareto frontier, score vs ΩESR" in report and (output / "report" / "report.html").exists()
    # and the report of the shipped router target sweep: every configuration of it, and its frontier
    sweep_run = SWEEP_RUN / "testbed"
    sweep = (output / "sweep_report" / "report.md").read_text()
    assert all(d.name in sweep for d in sweep_run.iterdir()) and "Pareto frontier, score vs ΩESR" in sweep
    assert f"router target sweep (precomputed): {output / 'sweep_report' / 'report.html'}" in printed
    # the shipped router is the sweep's router of its target: on the same prompts (CPU here, H200 there) it routes
    # every KV head the same way
    target = json.loads((TESTBED_DIR / "elastic_router" / "router_config.json").read_text())["training"]["targets"]
    routed = sorted(output.glob("testbed/elastic/*/1024/predictions.jsonl"))
    assert len(routed) == 4
    for path in routed:
        swept = sweep_run / f"elastic-router=sensitive_{target['sensitive']}" / path.parent.parent.name / "1024"
        first = json.loads((swept / "predictions.jsonl").read_text().splitlines()[0])
        assert json.loads(path.read_text().splitlines()[0])["decisions"] == first["decisions"]
    # DuoAttention and PruLong run the gates their trainers made (train-duo, train-prulong), as the sweep's trained
    # baselines did: the same heads full on every prompt; and every label names the learned file its row used
    for method, gates, swept in (("duo_attention", "duo_gates", "duo_attention-pattern=duo"),
                                 ("prulong", "prulong_gates", "prulong-pattern=prulong")):
        ours = json.loads(next(output.glob(f"testbed/{method}/testbed_repeat/1024/predictions.jsonl")).read_text()
                          .splitlines()[0])
        theirs = json.loads((sweep_run / swept / "testbed_repeat" / "1024" / "predictions.jsonl").read_text()
                            .splitlines()[0])
        assert ours["decisions"] == theirs["decisions"], method
        assert f"| {method} (pattern=testbed/{gates})" in report
    assert "| elastic (router=testbed/elastic_router)" in report
    assert ("learned files: duo_attention: pattern=testbed/duo_gates; elastic: router=testbed/elastic_router; "
            "prulong: pattern=testbed/prulong_gates") in printed


def test_the_demo_says_it_skips_the_sweep_report_where_its_run_folder_is_absent(tmp_path, monkeypatch, capsys):
    from elastic_bench.evaluation import commands

    monkeypatch.setattr(commands, "SWEEP_RUN", tmp_path / "absent")  # a wheel install: no docs/ beside the package
    commands._sweep_report(tmp_path / "sweep_report")
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("router target sweep (precomputed): skipped") and "docs/testbed/sweep_run" in line
    assert not (tmp_path / "sweep_report").exists()


def test_head_ablation_finds_the_shipped_retrieval_heads_and_writes_duo_gates(tmp_path):
    from elastic_bench.baselines.gates import load_gates
    from elastic_bench.testbed.training.heads import ablation_gates, write_gates

    model, _ = load_model("testbed", dtype=torch.float32, device="cpu")
    gates = ablation_gates(model, build(), length=1024, samples=4, progress=False)
    # layer 5, KV head 0 (the group of the supervised reader) carries the retrieval; no other head matters here
    assert gates.shape == (6, 2) and gates[5, 0] >= 0.5
    assert (gates > 0.25).sum() == 1
    write_gates(gates, tmp_path / "gates.tsv")
    assert load_gates(tmp_path / "gates.tsv") == pytest.approx(gates.round(4))
    shipped = load_gates(TESTBED_DIR / "head_ablation.tsv")
    assert shipped.shape == (6, 2) and int(np.argmax(shipped)) == 10 and (shipped > 0.25).sum() == 1  # GPU, 20 samples
