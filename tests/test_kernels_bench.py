"""``elastic-bench bench kernel``: cells, the command line, the JSON it writes."""

from __future__ import annotations

import json

import pytest
import torch

from elastic_bench.cli import main
from elastic_bench.kernels import Mode
from elastic_bench.kernels.bench import KernelBenchConfig, cell_plan, random_blocks


def test_cells_have_the_documented_head_mixes():
    cfg = KernelBenchConfig()
    gen = torch.Generator().manual_seed(0)
    counts = {}
    for cell in ("dense", "streaming", "fa-ssa", "block-sparse", "three-way"):
        modes = cell_plan(cell, cfg, 1024, "cpu", gen).modes[0].tolist()
        counts[cell] = [modes.count(int(m)) for m in Mode]
    assert counts == {"dense": [8, 0, 0], "streaming": [0, 8, 0], "fa-ssa": [4, 4, 0], "block-sparse": [0, 0, 8],
                      "three-way": [2, 3, 3]}
    plan = cell_plan("streaming", cfg, 1024, "cpu", gen)
    assert plan.streaming.blocks(128) == (1, 16) and plan.streaming.granularity == "block"


def test_random_blocks_density_and_structure():
    cfg = KernelBenchConfig(density=0.1)
    mask = random_blocks(cfg, 64 * 1024, "cpu", torch.Generator().manual_seed(0))  # [1, 32, 512, 512]
    n = mask.shape[-1]
    causal = n * (n + 1) // 2
    assert abs(mask[0].sum(dim=(-1, -2)).float().mean() / causal - 0.1) < 0.01
    assert mask[..., 0].all() and mask.diagonal(dim1=-2, dim2=-1).all()
    assert not mask.triu(1).any()
    assert torch.equal(mask[0, 0], mask[0, 3]) and not torch.equal(mask[0, 0], mask[0, 4])  # one draw per KV head


def test_bench_kernel_command_writes_json_and_a_table(tmp_path, capsys):
    out = tmp_path / "kernel.json"
    rc = main(["bench", "kernel", "--lengths", "300", "--cells", "three-way,xattention", "--query-heads", "4",
               "--kv-heads", "2", "--head-dim", "16", "--dtype", "float32", "--check", "--repeats", "3",
               "--no-progress", "--output", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert {"provenance", "config", "results", "command"} <= report.keys()
    assert report["provenance"]["versions"]["torch"]
    rows = {(r["cell"], r["backend"]): r for r in report["results"]}
    assert rows[("dense", "sdpa")]["speedup_vs_sdpa"] == 1.0
    three_way = rows[("three-way", "reference")]
    assert three_way["rel_error"] == 0.0 and three_way["ms"] > 0 and three_way["tflops"] > 0
    assert 0 < rows[("xattention", "reference")]["density"] <= 1
    table = capsys.readouterr().out
    assert "three-way" in table and "TFLOP/s" in table and "results:" in table


@pytest.mark.parametrize(
    "argv, message",
    [(["--cells", "nope"], "unknown cell"), (["--backends", "nope"], "not available"), (["--density", "0"], "density")],
)
def test_bench_kernel_rejects_bad_input_in_one_line(argv, message, capsys, tmp_path):
    rc = main(["bench", "kernel", "--lengths", "256", "--no-progress", "--output", str(tmp_path / "x.json"), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1


def test_bench_kernel_help_lists_cells(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "kernel", "--help"])
    assert "block-sparse" in capsys.readouterr().out
