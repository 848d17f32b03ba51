"""Tensor parallelism (`elastic_bench.modeling.tensor_parallel`) and device-map placement: the refusals come before
any weights load, and `run --tp 2` under torchrun (gloo, CPU, fp32), alone and beside data parallelism, records what
one process records, for every method."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from elastic_bench.modeling.loading import _config, check_placement, load_model
from elastic_bench.modeling.tensor_parallel import check
from elastic_bench.results.store import Cell

TINY = _config("llama", num_attention_heads=4, num_key_value_heads=2)


@pytest.mark.parametrize(("tp", "world", "error"), [
    (2, 1, "--tp 2 needs torchrun: torchrun --nproc-per-node 2"),
    (2, 3, "--tp 2 does not divide the 3 torchrun processes"),
    (4, 4, "--tp 4 does not divide the model's 2 KV heads"),
    (0, 1, "tp must be at least 1, got 0"),
])
def test_a_tensor_parallel_run_that_cannot_work_is_refused_on_the_config(tp, world, error):
    with pytest.raises(ValueError, match=error):
        check(TINY, tp, world)


def test_a_family_without_a_tensor_parallel_plan_is_refused():
    config = _config("llama")
    config.base_model_tp_plan = None  # what a family transformers ships no plan for holds
    with pytest.raises(ValueError, match="transformers has no tensor-parallel plan for model type 'llama'"):
        check(config, 2, 2)
    check(TINY, 2, 4)  # tp × dp: accepted


def test_a_device_map_cannot_join_tensor_parallelism_or_torchrun():
    with pytest.raises(ValueError, match="give --tp or --device-map, not both"):
        check_placement("tiny:llama", 2, "auto", 2)
    with pytest.raises(ValueError, match="run it in one process, not under torchrun"):
        check_placement("tiny:llama", 1, "auto", 2)


@pytest.mark.parametrize(("flags", "error"), [
    (["--tp", "2"], "--tp 2 needs torchrun: torchrun --nproc-per-node 2 -m elastic_bench run --tp 2 ..."),
    (["--tp", "2", "--batch-size", "auto"], "batch_size auto probes memory on one rank; give a number with --tp"),
    (["--device-map", "auto", "--device", "cpu"], "give --device or --device-map, not both"),
])
def test_the_command_line_refuses_in_one_line_before_the_model_loads(tmp_path, capsys, no_model, flags, error):
    from elastic_bench.cli import main

    code = main(["run", "--model", "tiny:llama", "--output", str(tmp_path / "out"), "--no-progress", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].endswith(error)


def test_device_map_auto_gives_the_logits_of_one_device():
    ids = torch.arange(3, 40)[None]
    plain, _ = load_model("tiny:qwen3", device="cpu")
    placed, _ = load_model("tiny:qwen3", device_map="auto")
    assert hasattr(placed, "hf_device_map")  # accelerate placed it
    with torch.no_grad():
        torch.testing.assert_close(placed(ids).logits, plain(ids).logits)


GATES = "1\t0\n0\t1\n"  # layers × KV heads: one FULL and one streaming head per layer, on different ranks
THRESHOLDS = "0.3\t0.95\t0.6\t0.9\n0.9\t0.4\t0.99\t0.5\n"  # layers × query heads: τ of every head its own
METHODS = {
    "full": [],
    "streaming": ["streaming.local=64"],
    "duo_attention": ["duo_attention.pattern={gates}", "duo_attention.local=64"],
    "prulong": ["prulong.pattern={gates}", "prulong.local=64"],
    "xattention": ["xattention.block_size=32", "xattention.stride=8", "xattention.thresholds={thresholds}"],
    "elastic": ["elastic.router=untrained", "elastic.sink=4", "elastic.local=64", "elastic.granularity=token",
                "elastic.sparse_decode=true"],
}
ROUTER_SEEDS = {"llama": 3, "qwen3": 6}  # untrained routers that route the two prompts differently
KEYS = ("id", "prediction", "score", "output_tokens", "omega_msr", "omega_esr", "omega_esr_last_row", "kv_bytes",
        "kv_bytes_full", "decisions")


def _run(tmp_path, name: str, model: str, methods: dict[str, list[str]], tasks: list[str], length: int,
         processes: int, tp: int, *extra: str) -> dict[str, list[dict]]:
    """`run` of ``methods`` (name → ``-O`` options) in ``processes`` processes with ``--tp tp`` (and the flags
    ``extra``): by cell (``method task``), its records (`KEYS`) and metrics' means; by ``method task routed``, its
    ``router_sparse_fraction``."""
    (tmp_path / "gates.tsv").write_text(GATES)
    (tmp_path / "tau.tsv").write_text(THRESHOLDS)
    options = [o.format(gates=tmp_path / "gates.tsv", thresholds=tmp_path / "tau.tsv") for opts in methods.values()
               for o in opts]
    args = ["run", "--model", model, "--methods", ",".join(methods), *[a for o in options for a in ("-O", o)],
            "--tasks", ",".join(tasks), "--lengths", str(length), "--limit", "2", "--device", "cpu", "--dtype",
            "float32", "--no-progress", "--tp", str(tp), "--output", str(tmp_path / name), *extra]
    launcher = [sys.executable, "-m", "elastic_bench"]
    if processes > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes),
                    "--master-port", str(29540 + processes), "-m", "elastic_bench"]
    done = subprocess.run([*launcher, *args], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    found = {}
    label = model.replace(":", "-")
    for method_dir in sorted((tmp_path / name / label).iterdir()):
        for task in tasks:
            cell = Cell(tmp_path / name, label, method_dir.name, task, length)
            metrics = cell.metrics()
            assert metrics["status"] == "complete" and metrics["world_size"] == processes and metrics["tp"] == tp
            key = f"{method_dir.name.split('-')[0]} {task}"
            found[key] = [{k: r.get(k) for k in KEYS} for r in cell.predictions()] + [
                {k: metrics.get(k) for k in ("score", "omega_msr", "omega_esr", "kv_bytes")}]
            found[f"{key} routed"] = metrics.get("router_sparse_fraction")
    return found


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tensor_parallel_runs_record_what_one_process_records(tmp_path, arch):
    """`--tp 2` over 2 gloo ranks, and (tiny:llama) `--tp 2` with 2 data-parallel replicas over 4, give every method's
    predictions, scores, per-sample ΩMSR / ΩESR, decisions and KV bytes of one process, to the last bit."""
    methods = {**METHODS, "elastic": [*METHODS["elastic"], f"elastic.seed={ROUTER_SEEDS[arch]}"]}
    cells = (f"tiny:{arch}", methods, ["ruler_niah_single_1"], 640)
    one = _run(tmp_path, "one", *cells, 1, 1)
    assert len(one) == 2 * len(METHODS)
    elastic = [r["decisions"] for r in one["elastic ruler_niah_single_1"][:-1]]
    assert elastic[0] != elastic[1]  # the two prompts are routed differently
    assert all(r["kv_bytes"] < r["kv_bytes_full"] for r in one["duo_attention ruler_niah_single_1"][:-1])  # evicted
    assert 0 < one["xattention ruler_niah_single_1"][-1]["omega_esr"]  # the per-head thresholds select blocks
    assert _run(tmp_path, "tp", *cells, 2, 2) == one
    if arch == "llama":  # rank 0's method statistics (router_sparse_fraction) cover its replica's samples only
        assert {k: v for k, v in _run(tmp_path, "tp_dp", *cells, 4, 2).items() if "routed" not in k} == \
            {k: v for k, v in one.items() if "routed" not in k}


@pytest.mark.slow
def test_the_testbed_loads_sharded_and_its_router_routes_each_rank_s_heads(tmp_path):
    """The shipped testbed (a checkpoint: loaded sharded by transformers) with its router (centred features: a mean
    per KV head) and gates: `--tp 2` records what one process records, on a sensitive and a robust task."""
    cells = ("testbed", {"elastic": [], "duo_attention": []}, ["testbed_niah_single", "testbed_repeat"], 1024)
    allow = "--allow-in-distribution"  # the router was trained on the testbed's tasks, the only ones it knows
    one = _run(tmp_path, "one", *cells, 1, 1, allow)
    msr = {r["omega_msr"] for records in one.values() if isinstance(records, list) for r in records[:-1]}
    assert len(msr) > 2  # the router routes the two tasks differently
    assert _run(tmp_path, "tp", *cells, 2, 2, allow) == one
