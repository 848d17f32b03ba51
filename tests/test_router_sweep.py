"""A router target sweep as the README composes it: one `train-router` per target, one `run` of `elastic` per router
into one run folder beside the other methods, and one report that lists every router's point; and the testbed's
shipped sweep, on whose frontier its router was chosen."""

from __future__ import annotations

import json
from statistics import mean

from elastic_bench.cli import main
from elastic_bench.evaluation.commands import SWEEP_RUN
from elastic_bench.method import synthetic_records
from elastic_bench.modeling.loading import TESTBED_DIR
from elastic_bench.reports import load_cells, pareto_front
from elastic_bench.testbed.generators import SPECS

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


def test_the_shipped_router_is_the_one_the_testbed_sweeps_rule_picks():
    """docs/testbed.md's rule, applied to the shipped sweep run (H200, 50 samples per cell): of the routers on the
    frontier of mean score vs mean ΩESR over all methods, those within 2 points of full on each family; the sparsest
    of them, a tie going to the router whose sensitive ΩMSR is closest to its target."""
    cells = load_cells(SWEEP_RUN)
    assert all(c.complete and c.num_samples == 50 for c in cells)
    methods = sorted({c.method for c in cells})
    assert all(len([c for c in cells if c.method == m]) == 12 for m in methods)  # 4 tasks × 1K / 2K / 4K each
    family = {f"testbed_{name}": spec.category for name, spec in SPECS.items()}

    def stat(method, key, category=None):
        return mean(getattr(c, key) for c in cells if c.method == method and category in (None, family[c.task]))

    front = [methods[i] for i in pareto_front([(stat(m, "omega_esr"), stat(m, "score")) for m in methods])]
    assert {"full", "streaming-sink=16-local=256", "xattention", "duo_attention-pattern=duo",
            "prulong-pattern=prulong"} < set(methods)
    target = {m: float(m.rsplit("_", 1)[1]) for m in methods if m.startswith("elastic-router=sensitive_")}
    eligible = [m for m in front if m in target and all(stat(m, "score", f) >= stat("full", "score", f) - 2
                                                        for f in ("sensitive", "robust"))]
    assert eligible, "no router of the sweep is on its frontier within 2 points of full"
    chosen = max(eligible, key=lambda m: (stat(m, "omega_esr"), -abs(stat(m, "omega_msr", "sensitive") - target[m])))
    shipped = json.loads((TESTBED_DIR / "elastic_router" / "router_config.json").read_text())["training"]
    assert shipped["targets"] == {"sensitive": target[chosen], "robust": 1.0}
