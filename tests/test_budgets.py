"""Budgets: the monotone knob search (targets met, steps, targets out of reach), the two-knob calibration, a method
without a knob, the folders and fingerprints of a budget run, and `elastic-bench calibrate` on the testbed (every
method with a knob within the tolerance on held-out prompts; full on the same prompts)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from elastic_bench import cli, get_method
from elastic_bench.evaluation import calibration
from elastic_bench.evaluation.calibration import Budget, BudgetConfig, calibrate, search
from elastic_bench.modeling.interface import SparsityKnob
from elastic_bench.results.store import Cell

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

WINDOW = SparsityKnob("local", "lower", low=1, integer=True)
MARGIN = SparsityKnob("margin", "higher")


def test_search_meets_a_smooth_target_in_few_steps_from_either_side():
    def skipped(local):  # streaming's ΩESR at 1000 tokens, roughly
        return max(0.0, 1 - local / 1000) ** 2

    for start in (2048, 5):
        tried = search(skipped, WINDOW, 0.5, 0.02, start)
        best = min(tried, key=lambda t: abs(t[1] - 0.5))
        assert abs(best[1] - 0.5) <= 0.005 and isinstance(best[0], int) and len(tried) <= 8


def test_search_on_a_step_function_stops_and_ends_in_the_middle_of_the_step():
    def routed(margin):  # one head flips at margin 3 on one prompt, at 9 on the other
        return 0.4 + 0.05 * (margin > 3) + 0.05 * (margin > 9)

    tried = search(routed, MARGIN, 0.46, 0.02, 0.0)
    assert len(tried) <= 12
    value, measure = tried[-1]
    assert measure == pytest.approx(0.45) and 4 < value < 9  # between the flips, not at an edge


def test_search_gives_up_on_an_unbounded_knob_that_saturates():
    tried = search(lambda margin: min(0.53, 0.49 + 0.04 * (margin > 40)), MARGIN, 0.9, 0.02, 0.0)
    assert max(m for _, m in tried) == pytest.approx(0.53) and len(tried) <= 12


def test_calibrate_refines_a_coarse_head_share_with_the_window(monkeypatch):
    """DuoAttention on 12 heads: the share of streaming heads moves ΩESR in steps of a twelfth of a head's pruning; the
    window then brings it to the budget, widened from its default where the share overshoots."""
    def fake(model, method, prompts, measure, backend="auto"):
        heads = math.floor(method.sparsity * 12 + 1e-9)
        return heads / 12 * max(0.0, 1 - method.local / 1000)

    monkeypatch.setattr(calibration, "measured", fake)
    method = get_method("duo_attention", pattern="auto")
    assert fake(None, method, [], "") == pytest.approx(6 / 12 * 0.744)  # half the heads at the default window
    found = calibrate(None, method, Budget("omega_esr", 0.46, 0.005), [[1]])  # 7 heads: 0.434, 8 heads: 0.496
    assert found.error is None and abs(found.achieved - 0.46) <= 0.005 and found.options["sparsity"] > 7 / 12
    assert found.options["local"] > method.local  # widened: no head streams with less than its window
    found = calibrate(None, method, Budget("omega_esr", 0.9, 0.01), [[1]])  # past every head at the default window
    assert found.error is None and found.options["sparsity"] == 1.0 and found.options["local"] < method.local
    found = calibrate(None, method, Budget("omega_esr", 1.0, 0.0005), [[1]])  # a window of 1 keeps 0.001
    assert found.error.startswith("ΩESR 1 is out of reach")


def test_a_method_without_a_knob_is_reported_as_such():
    found = calibrate(None, get_method("full"), Budget("omega_esr", 0.5, 0.02), [[1]])
    assert found.error == "full has no sparsity knob: it cannot be calibrated to a budget" and not found.tried


def test_budget_configurations_name_the_budget_and_leave_the_knob_out():
    config = BudgetConfig(budgets=[0.3, 0.5])
    streaming = get_method("streaming", sink=16)
    found = calibration.entries(streaming, {"sink": 16}, lambda m, b: b.tag if b else "-", config)
    assert [budget.target for _, budget in found] == [0.3, 0.5]
    assert calibration.label(streaming, found[0][1], {}, None) == "streaming-esr=0.3-sink=16"
    assert calibration.entries(get_method("full"), {}, lambda m, b: "full", config) == [("full", None)]
    with pytest.raises(ValueError, match="streaming.local is the knob calibrate sets"):
        calibration.entries(streaming, {"local": 64}, lambda m, b: "", config)
    for bad, message in (([1.5], "must lie in"), ([0.3, 0.3], "twice"), ([], "empty")):
        with pytest.raises(ValueError, match=message):
            BudgetConfig(budgets=bad)


def test_calibrate_command_refuses_bad_input_in_one_line(capsys, no_model):
    assert cli.main(["calibrate", "--model", "testbed", "--budgets", "0.5,2"]) == 2
    err = capsys.readouterr().err
    assert "--budgets must lie in [0, 1], got 2.0" in err and "Traceback" not in err
    assert cli.main(["calibrate", "--model", "testbed", "--methods", "streaming", "-O", "streaming.local=64"]) == 2
    assert "streaming.local is the knob calibrate sets" in capsys.readouterr().err


@pytest.fixture
def one_thread():
    """One intra-op thread: the testbed's small matrices gain nothing from two, and lose much on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_calibrate_on_the_testbed_meets_the_budget_on_held_out_prompts(tmp_path, capsys, one_thread):
    """Every method with a knob at ΩESR 0.3 (the testbed at 1K: a budget every knob reaches): calibrated on two
    prompts, it lands within the tolerance on the two held-out ones; full runs once on the same held-out prompts;
    every cell records the split and its prefill taken apart. (Budgets out of a knob's reach: the search's tests.)"""
    output = tmp_path / "run"
    methods = ["streaming", "xattention", "duo_attention", "elastic", "oracle"]
    code = cli.main(["calibrate", "--model", "testbed", "--methods", ",".join(["full", *methods]), "--tasks",
                     "testbed_niah_single", "--lengths", "1K", "--limit", "2", "--calibration-samples", "2",
                     "--budgets", "0.3", "--allow-in-distribution", "--no-progress", "--output", str(output)])
    printed = capsys.readouterr().out
    assert code == 0 and "held out" in printed
    assert {p.name for p in (output / "testbed").iterdir()} == {"full", *(f"{m}-esr=0.3" for m in methods)}
    reference = Cell(output, "testbed", "full", "testbed_niah_single", 1024).metrics()
    assert reference["status"] == "complete" and reference["prediction_ids"] == ["2", "3"]
    assert reference["calibration"] == {"calibration_ids": {"testbed_niah_single": ["0", "1"]}}
    for method in methods:
        metrics = Cell(output, "testbed", f"{method}-esr=0.3", "testbed_niah_single", 1024).metrics()
        record = metrics["calibration"]
        assert metrics["status"] == "complete" and metrics["prediction_ids"] == ["2", "3"], method
        assert record["calibration_ids"] == {"testbed_niah_single": ["0", "1"]} and record["within_tolerance"]
        assert abs(metrics["omega_esr"] - 0.3) <= record["tolerance"] == 0.02, method  # on the held-out prompts
        assert metrics["fingerprint"]["budget"] == {"measure": "omega_esr", "target": 0.3, "tolerance": 0.02}
        assert get_method(method).knobs[0].option in record["knobs"]
        assert get_method(method).knobs[0].option not in metrics["fingerprint"]["method_options"]
    assert Cell(output, "testbed", "elastic-esr=0.3", "testbed_niah_single", 1024).metrics()["calibration"][
        "knobs"]["margin"] < 0  # the testbed's router streams most heads: a negative margin sends more to full
    record = json.loads((output / "testbed/oracle-esr=0.3/testbed_niah_single/1024/predictions.jsonl").read_text()
                        .splitlines()[0])
    assert set(record["prefill_parts"]) == {"model", "routing", "estimation", "planning", "accounting", "attention"}
    assert record["prefill_parts"]["estimation"] > 0 and record["prefill_parts"]["attention"] > 0
    assert "prefill_unexplained" in Cell(output, "testbed", "oracle-esr=0.3", "testbed_niah_single", 1024).metrics()


def test_a_calibration_that_fails_fails_its_cells_and_the_run_goes_on(tmp_path, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the measure broke")

    monkeypatch.setattr(calibration, "measured", broken)  # a failure inside the search, after the inputs were checked
    output = tmp_path / "run"
    code = cli.main(["calibrate", "--model", "testbed", "--methods", "duo_attention", "--tasks", "testbed_niah_single",
                     "--lengths", "1K", "--limit", "1", "--calibration-samples", "1", "--budgets", "0.4,0.5",
                     "--no-progress", "--output", str(output)])
    assert code == 1
    for budget in ("0.4", "0.5"):
        folder = next((output / "testbed").glob(f"duo_attention-esr={budget}*"))
        metrics = Cell(output, "testbed", folder.name, "testbed_niah_single", 1024).metrics()
        assert metrics["status"] == "failed" and "the measure broke" in metrics["error"]
        assert metrics["error"].startswith("calibration: RuntimeError")
