"""The runner and the results store: files per cell, resume, skip, failure recording; the CLI's error contract."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from elastic_bench import cli
from elastic_bench.evaluation.runner import RunConfig, even, run
from elastic_bench.evaluation.terminal import CPU_CAVEAT, format_rows
from elastic_bench.modeling import generation
from elastic_bench.results.store import Cell

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def counted_generation(monkeypatch):
    calls = []
    original = generation.greedy_generate

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(generation, "greedy_generate", counting)
    return calls


def small_config(tmp_path, **overrides):
    base = dict(model="tiny:qwen3", methods=["full", "streaming"], tasks=["ruler_niah_single_1"], lengths=[640, 768],
                progress=False,
                limit=2, output=str(tmp_path / "run"), method_options={"streaming": {"local": 128}})
    return RunConfig(**(base | overrides))


def test_run_writes_every_cell_and_rerun_does_no_work(tmp_path, counted_generation):
    config = small_config(tmp_path)
    rows = run(config)
    assert len(rows) == 4 and all(r["status"] == "complete" for r in rows)
    assert len(counted_generation) == 8
    for method in ("full", "streaming-local=128"):
        for length in (640, 768):
            cell = Cell(config.output, "tiny-qwen3", method, "ruler_niah_single_1", length)
            assert {p.name for p in cell.dir.iterdir()} == {"config.json", "predictions.jsonl", "metrics.json"}
            metrics = cell.metrics()
            provenance = ("versions", "git_hash", "source_digest", "device")
            for key in ("score", "omega_msr", "omega_esr", "prefill_seconds", *provenance):
                assert key in metrics
            assert len(cell.predictions()) == 2
            assert metrics["omega_msr"] == (0.0 if method == "full" else 1.0)
    for record in Cell(config.output, "tiny-qwen3", "streaming-local=128", "ruler_niah_single_1", 768).predictions():
        S, w = record["input_tokens"], 128 + 128  # sink + local
        assert record["omega_esr"] == pytest.approx(1 - (w * (w + 1) / 2 + (S - w) * w) / (S * (S + 1) / 2))
    counted_generation.clear()
    run(config)
    assert counted_generation == []


def test_overall_progress_bar_counts_cells_done_and_skipped(tmp_path, capsys):
    config = small_config(tmp_path, lengths=[640], limit=1, progress=True)
    run(config)
    err = capsys.readouterr().err
    assert "cell 1 of 2 (full · ruler_niah_single_1 · 640)" in err and "cell 2 of 2 (streaming-local=128" in err
    assert "2/2" in err and "3 of 2" not in err
    run(config)  # every cell complete: counted as done without a cell description
    err = capsys.readouterr().err
    assert "2/2" in err and "cell 1 of 2" not in err


def _row(method, score, status="complete", device="cpu (x86_64)", learned=None, **values):
    return {"model": "testbed", "method": method, "task": "testbed", "length": 1024, "status": status,
            "score": score, "n": 3 if status == "complete" else None, "omega_msr": values.get("msr"),
            "omega_esr": values.get("esr"), "prefill_ms": values.get("ms"), "device": device,
            "learned_files": learned or {}}


def test_format_rows_summarises_methods_with_fixed_decimals_a_legend_and_the_cpu_caveat():
    rows = [_row("full", 100.0, msr=0.0, esr=0.0, ms=20.0), _row("full", 0, msr=0.0, esr=0.0, ms=40.0),
            _row("streaming", 100 / 3, msr=1.0, esr=0.5, ms=90.0),
            _row("streaming", None, status="failed", device=None),
            _row("elastic", 50.0, msr=0.5, esr=0.2, ms=10.0, learned={"router": "testbed/elastic_router"})]
    text = format_rows(rows, "runs/demo")
    lines = text.splitlines()
    summary = lines[:lines.index("")]
    assert summary[0].split() == ["method", "complete", "failed", "score", "n", "ΩMSR", "ΩESR", "prefill_ms",
                                  "(median)"]
    assert summary[2].split() == ["full", "2/2", "0", "50.0", "6", "0.000", "0.000", "30.0"]  # 6 samples behind 50.0
    assert summary[3].split() == ["streaming", "1/2", "1", "33.3", "3", "1.000", "0.500", "90.0"]
    cells = [line.split() for line in lines[len(summary) + 1:]]
    assert cells[0] == ["model", "method", "task", "length", "status", "score", "n", "ΩMSR", "ΩESR", "prefill_ms"]
    assert [row[5:7] for row in cells[2:6]] == [["100.0", "3"], ["0.0", "3"], ["33.3", "3"], ["-", "-"]]
    assert "learned files: elastic: router=testbed/elastic_router" in lines
    assert "elastic-bench report runs/demo" in text and lines[-1] == CPU_CAVEAT
    on_gpu = format_rows([_row("full", 50.0, device="NVIDIA H200", ms=5.0)], "runs/gpu")
    assert CPU_CAVEAT not in on_gpu and "50.0" in on_gpu
    assert format_rows([], "runs/none") == "(no cells)"


def test_interrupted_cell_resumes_from_its_predictions(tmp_path, counted_generation):
    config = small_config(tmp_path, methods=["full"], lengths=[640], method_options={}, limit=3)
    run(config)
    cell = Cell(config.output, "tiny-qwen3", "full", "ruler_niah_single_1", 640)
    lines = cell.predictions_path.read_text().splitlines()
    cell.predictions_path.write_text("\n".join(lines[:2]) + '\n{"id": "2", "predic')  # torn last line
    cell.metrics_path.unlink()
    counted_generation.clear()
    run(config)
    assert len(counted_generation) == 1
    assert [r["id"] for r in cell.predictions()] == ["0", "1", "2"] and cell.is_complete()


def test_a_folder_of_another_configuration_is_refused_before_any_work(tmp_path, counted_generation):
    config = small_config(tmp_path, methods=["full"], lengths=[640], method_options={})
    run(config)
    counted_generation.clear()
    for change, named in (({"seed": 7}, "seed"), ({"limit": 3}, "limit"), ({"dtype": "bfloat16"}, "dtype")):
        with pytest.raises(ValueError, match=rf"holds results of another configuration \({named} differ\)"):
            run(small_config(tmp_path, methods=["full"], lengths=[640], method_options={}, **change))
    assert counted_generation == []
    assert Cell(config.output, "tiny-qwen3", "full", "ruler_niah_single_1", 640).is_complete()  # results kept


def test_failed_cell_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.delenv("ELASTIC_BENCH_DATA", raising=False)  # ruler_niah_single_2 reads RULER's essays: not there
    config = small_config(tmp_path, tasks=["ruler_niah_single_2", "ruler_niah_single_1"], lengths=[640],
                          data_dir=str(tmp_path / "no-data"))
    rows = run(config)
    statuses = {(r["method"], r["task"]): r["status"] for r in rows}
    assert statuses[("full", "ruler_niah_single_2")] == "failed"
    assert statuses[("full", "ruler_niah_single_1")] == "complete"
    metrics = Cell(config.output, "tiny-qwen3", "full", "ruler_niah_single_2", 640).metrics()
    assert "PaulGrahamEssays" in metrics["error"]


def test_a_length_too_short_for_a_task_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    from elastic_bench.modeling import loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError, match="too short"):
        run(small_config(tmp_path, lengths=[64, 640]))
    assert not any((tmp_path / "run").glob("*/*/*/*/metrics.json"))


def test_a_run_resolves_its_model_spec_once(tmp_path, monkeypatch):
    from elastic_bench.modeling import loading

    model, tokenizer = loading.load_model("tiny:llama", device="cpu")
    folder = tmp_path / "tiny-folder"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    calls = {"resolve_model": [], "gguf_file": []}
    for name, found in calls.items():
        original = getattr(loading, name)

        def counting(spec, *args, original=original, found=found, **kwargs):
            if isinstance(spec, str):  # a resolved `ModelSource` is passed through, not resolved again
                found.append(spec)
            return original(spec, *args, **kwargs)

        monkeypatch.setattr(loading, name, counting)
    rows = run(small_config(tmp_path, model=str(folder), methods=["full", "streaming"], lengths=[640, 768],
                            limit=1))
    assert [r["status"] for r in rows] == ["complete"] * 4 and {r["model"] for r in rows} == {"tiny-folder"}
    assert calls == {"resolve_model": [str(folder)], "gguf_file": [str(folder)]}


def test_auto_batches_four_on_the_cpu_after_the_timed_prompts(tmp_path, counted_generation):
    """``batch_size: auto`` is 4 on the CPU: after the one timed prompt, run alone, the other five run in the fewest
    batches of at most four, as even as they can be (three and two); the prompt run alone is timed, the batched ones
    give the cell's throughput."""
    config = small_config(tmp_path, methods=["full"], lengths=[640], method_options={}, limit=6, batch_size="auto",
                          device="cpu", timed_samples=1)
    run(config)
    cell = Cell(config.output, "tiny-qwen3", "full", "ruler_niah_single_1", 640)
    records, metrics = cell.predictions(), cell.metrics()
    assert [r["batch_size"] for r in records] == [1, 3, 3, 3, 2, 2] and len(counted_generation) == 1
    assert [r["prefill_seconds"] is not None for r in records] == [True] + [False] * 5
    assert all(r["generation_seconds"] > 0 for r in records[1:]) and "generation_seconds" not in records[0]
    assert metrics["batch_size"] == "auto" and metrics["batch_size_used"] == 3 and metrics["prefill_samples"] == 1
    assert metrics["samples_per_second"] == pytest.approx(5 / sum(r["generation_seconds"] for r in records[1:]))


def test_batches_are_as_even_as_they_can_be():
    assert [even(n, 4) for n in (1, 4, 5, 8, 9, 47)] == [1, 4, 3, 4, 3, 4]
    assert [even(50, most) for most in (64, 50, 25, 12, 1)] == [50, 50, 25, 10, 1]


def test_config_validation_and_yaml(tmp_path):
    with pytest.raises(ValueError, match="positive"):
        RunConfig(lengths=[0])
    with pytest.raises(ValueError, match="did you mean"):
        RunConfig(tasks=["ruler_niah_single"])
    path = tmp_path / "run.yaml"
    path.write_text("model: tiny:llama\nlengths: [512]\nbogus: 1\n")
    with pytest.raises(ValueError, match="unknown keys"):
        RunConfig.from_yaml(path)
    path.write_text("model: tiny:llama\nlengths: [512]\nmethods: [full]\n")
    assert RunConfig.from_yaml(path) == {"model": "tiny:llama", "lengths": [512], "methods": ["full"]}


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["run", "--methods", "ful"], "unknown method 'ful'; did you mean full"),
        (["run", "--tasks", "ruler_niah_single"], "did you mean ruler_niah_single_"),
        (["run", "--model", "tiny:qwen"], "did you mean tiny:qwen3"),
        (["run", "-O", "streaming.lokal=3"], "did you mean local"),
        (["run", "--batch-size", "0"], "batch_size must be at least 1 or auto, got 0"),
        (["run", "--timed-samples", "-1"], "timed_samples must be >= 0"),
    ],
)
def test_cli_user_errors_are_one_line(argv, expected, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_cli_subprocess_exit_code_and_listing(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "elastic_bench", "run", "--methods", "nope"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1
    listing = subprocess.run([sys.executable, "-m", "elastic_bench", "methods"], capture_output=True, text=True)
    assert listing.returncode == 0 and "streaming" in listing.stdout and re.search(r"\blocal +2048 ", listing.stdout)


def test_cli_run_writes_summary(tmp_path, capsys):
    out = tmp_path / "cli"
    code = cli.main(["run", "--methods", "full", "--lengths", "640", "--limit", "1", "--output", str(out),
                     "--no-progress"])
    assert code == 0
    assert "complete" in capsys.readouterr().out
    config = json.loads((out / "tiny-qwen3" / "full" / "ruler_niah_single_1" / "640" / "config.json").read_text())
    assert config["method"] == "full" and config["length"] == 640


@pytest.mark.slow
def test_torchrun_two_ranks_shard_samples_and_match_one_process(tmp_path):
    """Two gloo ranks on the CPU split a cell's samples; rank 0's merged results equal a one-process run."""
    args = ["run", "--methods", "full,streaming", "-O", "streaming.local=128", "--lengths", "640", "--limit", "3",
            "--device", "cpu", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29533",
                "-m", "elastic_bench"]
    two = subprocess.run([*launcher, *args, "--output", str(tmp_path / "two")], capture_output=True, text=True, env=env)
    assert two.returncode == 0, two.stderr[-2000:]
    one = subprocess.run([sys.executable, "-m", "elastic_bench", *args, "--output", str(tmp_path / "one")],
                         capture_output=True, text=True, env=env)
    assert one.returncode == 0, one.stderr[-2000:]
    for method in ("full", "streaming-local=128"):
        cells = [Cell(tmp_path / run, "tiny-qwen3", method, "ruler_niah_single_1", 640) for run in ("two", "one")]
        preds = [[(r["id"], r["prediction"], r["omega_esr"]) for r in c.predictions()] for c in cells]
        assert preds[0] == preds[1] and len(preds[0]) == 3
        assert not list(cells[0].dir.glob("predictions.rank*"))
        metrics = [c.metrics() for c in cells]
        assert metrics[0]["world_size"] == 2 and metrics[0]["score"] == metrics[1]["score"]


def test_source_digest_names_the_code_not_the_checkout(tmp_path):
    from elastic_bench.results.provenance import digest, source_digest

    a, b = tmp_path / "a" / "pkg", tmp_path / "b" / "pkg"
    for root in (a, b):
        (root / "sub").mkdir(parents=True)
        (root / "mod.py").write_text("x = 1\n")
        (root / "sub" / "inner.py").write_text("y = 2\n")
    (b / "notes.txt").write_text("not code")  # only Python files count
    assert digest([a]) == digest([b])  # same code in two places
    (b / "sub" / "inner.py").write_text("y = 3\n")
    assert digest([a]) != digest([b])
    assert len(source_digest()) == 16 and source_digest() == source_digest()
