"""A router target sweep as the README composes it: one `train-router` per target, one `run` of `elastic` per router
into one run folder beside the other methods, and one report that lists every router's point."""

from __future__ import annotations

import json

from elastic_bench.cli import main
from elastic_bench.method import synthetic_records

RUN = ["--model", "tiny:llama", "--tasks", "ruler_niah_single_1", "--lengths", "640", "--limit", "1", "--device",
       "cpu", "--no-progress"]


def test_a_two_target_sweep_gives_two_routers_two_elastic_cells_and_one_report(tmp_path, capsys):
    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in synthetic_records(8, length=150)))
    targets = (0.3, 0.9)
    for target in targets:
        router = tmp_path / "routers" / f"sensitive_{target}"
        assert main(["train-router", "--model", "tiny:llama", "--data", str(data), "--steps", "2", "--rows-per-step",
                     "1", "--pack-tokens", "1024", "--sink", "4", "--local-window", "32", "--granularity", "token",
                     "--device", "cpu", "--no-progress", "--target", f"sensitive={target}", "--target", "robust=1.0",
                     "--seed", "3", "--output", str(router)]) == 0
        assert main(["run", *RUN, "--methods", "elastic", "-O", f"elastic.router={router}", "--output",
                     str(tmp_path / "run")]) == 0
    assert main(["run", *RUN, "--methods", "full,streaming", "-O", "streaming.local=64", "--output",
                 str(tmp_path / "run")]) == 0
    trained = [json.loads((tmp_path / "routers" / f"sensitive_{t}" / "router_config.json").read_text())["training"]
               for t in targets]
    assert [t["targets"]["sensitive"] for t in trained] == list(targets) and all(t["seed"] == 3 for t in trained)
    cells = sorted(p.parent.parent.parent.name for p in (tmp_path / "run").rglob("metrics.json"))
    assert cells == ["elastic-router=sensitive_0.3", "elastic-router=sensitive_0.9", "full", "streaming-local=64"]
    assert main(["report", str(tmp_path / "run")]) == 0
    report = (tmp_path / "run" / "report" / "report.md").read_text()
    assert "elastic-router=sensitive_0.3" in report and "elastic-router=sensitive_0.9" in report
    capsys.readouterr()
