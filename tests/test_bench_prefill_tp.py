"""``bench prefill --tp``: under torchrun (gloo, CPU, fp32) the tensor-parallel benchmark records one process's
sparsity for every method and writes one report, from rank 0; the refusals come in one line before any weights load."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from elastic_bench.bench.prefill import slowest
from elastic_bench.cli import main

# every method of the benchmark; --density gives the XAttention heads random blocks that skip pairs at 512 tokens
ARGS = ["--model", "tiny:llama", "--device", "cpu", "--lengths", "512", "--repeats", "1", "--density", "0.5",
        "--methods", "sdpa,fa-ssa,fa-xa,xa-ssa,duo_attention,streaming,xattention", "--router", "untrained",
        "--no-progress"]
SPARSITY = ("omega_msr", "omega_esr", "omega_esr_last_row", "block_density")


def _sparsity(report: dict) -> dict[str, dict]:
    """method → its sparsity figures (`SPARSITY`, those it has), with no method failed."""
    assert all("error" not in r for r in report["results"]), report["results"]
    return {r["method"]: {k: r[k] for k in SPARSITY if k in r} for r in report["results"]}


@pytest.mark.slow
def test_tensor_parallel_bench_records_what_one_process_records(tmp_path):
    """`--tp 2` over 2 gloo ranks: one JSON, written by rank 0 with `tp` 2, whose per-method ΩMSR / ΩESR and block
    density are one process's (timings are not compared)."""
    assert main(["bench", "prefill", *ARGS, "--output", str(tmp_path / "one.json")]) == 0
    one = json.loads((tmp_path / "one.json").read_text())
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29561",
                "-m", "elastic_bench"]
    done = subprocess.run([*launcher, "bench", "prefill", *ARGS, "--tp", "2", "--output", str(tmp_path / "tp.json")],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("results: ") == 1  # rank 0 alone prints and writes
    tp = json.loads((tmp_path / "tp.json").read_text())
    assert tp["tp"] == tp["config"]["tp"] == 2 and one["tp"] == 1
    assert all(r["median_s"] > 0 for r in tp["results"])
    found = _sparsity(tp)
    assert found == _sparsity(one)
    # what makes the comparison bite: the seeded split (3 of 4 KV heads sparse) spans both ranks' heads, and the
    # random blocks of the XAttention heads skip pairs
    assert found["fa-ssa"]["omega_msr"] == 0.75
    assert found["fa-xa"]["omega_esr"] > 0 and found["fa-xa"]["block_density"] < 1


def test_the_slowest_rank_times_each_span():
    ranks = [{"forward": [1.0, 4.0], "plan": [0.5, 0.1]}, {"forward": [2.0, 3.0], "plan": [0.2, 0.3],
                                                          "estimation": [0.1, 0.2]}]
    assert slowest(ranks) == {"forward": [2.0, 4.0], "plan": [0.5, 0.3], "estimation": [0.1, 0.2]}


@pytest.mark.parametrize(("world", "flags", "error"), [
    (1, ["--tp", "2"], "--tp 2 needs torchrun: torchrun --nproc-per-node 2 -m elastic_bench bench prefill --tp 2 ..."),
    (4, ["--tp", "2"], "bench prefill times one model over every torchrun process: give --tp 4, not --tp 2"),
    (2, [], "bench prefill times one model over every torchrun process: give --tp 2, not --tp 1"),
    (3, ["--tp", "3"], "--tp 3 does not divide the model's 64 query heads"),
    (16, ["--tp", "16"], "--tp 16 does not divide the model's 8 KV heads"),
    (1, ["--tp", "0"], "tp must be at least 1, got 0"),
])
def test_a_tensor_parallel_bench_that_cannot_work_is_refused_in_one_line(tmp_path, capsys, monkeypatch, no_model,
                                                                         world, flags, error):
    """On Llama-3.1-70B's shapes, read from its config (`no_model`: nothing loads), before torchrun's process group
    is joined (rank 0 of ``world``)."""
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", "0")
    code = main(["bench", "prefill", "--model", "random:llama-3.1-70b", "--output", str(tmp_path / "out.json"),
                 "--no-progress", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].endswith(error)
