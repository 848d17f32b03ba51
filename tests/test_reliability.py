"""Results that cannot be corrupted: one writer per output folder, complete cells that prove themselves, results known
by their configuration (learned files by their contents), invalid results refused, and a run killed at random points
resumes to the uninterrupted run's results."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.tasks_data import write_longbench

from elastic_bench import cli
from elastic_bench.foundation.files import LOCK_FILE, exclusive
from elastic_bench.results.store import Cell

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# Fields that differ from run to run.
TIMING = ("prefill_seconds", "prefill_seconds_median", "prefill_parts", "decode_seconds", "decode_ms_per_token", "date",
          "predictions_sha256", "prefill_unexplained", "line_sha256")  # a line's seal covers its timing
ARGS = ["--model", "tiny:qwen3", "--tasks", "ruler_niah_single_1", "--lengths", "640", "--device", "cpu",
        "--no-progress"]


def _run(out: Path, *extra: str) -> int:
    return cli.main(["run", "--methods", "full", "--limit", "2", *ARGS, "--output", str(out), *extra])


def _cell(out: Path, method: str = "full", length: int = 640) -> Cell:
    return Cell(out, "tiny-qwen3", method, "ruler_niah_single_1", length)


def _results(out: Path) -> dict[str, object]:
    """Every cell file of a run folder, JSON-parsed, without the fields that differ between identical runs."""

    def clean(record):
        return {k: v for k, v in record.items() if k not in TIMING}

    found = {}
    for path in sorted(out.glob("*/*/*/*/*.json*")):
        key = str(path.relative_to(out))
        if path.suffix == ".jsonl":
            found[key] = [clean(json.loads(line)) for line in path.read_text().splitlines()]
        else:
            found[key] = clean(json.loads(path.read_text()))
    return found


def _subprocess_run(out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "elastic_bench", "run", *extra, "--output", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_second_writer_stops_with_one_line_naming_the_first(tmp_path, capsys):
    """A writer in another process holds the folder (until its stdin closes, so the test cannot race it): `run`
    stops with one line naming it, writes nothing, and runs once the lock is released."""
    out = tmp_path / "run"
    holder = ("import sys; from elastic_bench.foundation.files import exclusive\n"
              f"with exclusive({str(out)!r}, 'run'):\n    print('held', flush=True); sys.stdin.read()")
    first = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held", first.communicate()
        assert _run(out) == 2
        err = capsys.readouterr().err.strip()
        assert f"is being written by pid {first.pid}" in err and len(err.splitlines()) == 1
        assert not list(out.glob("*/*/*/*/*.json*"))
    finally:
        first.communicate(timeout=60)
    assert first.returncode == 0 and not (out / LOCK_FILE).exists()  # released at the end
    assert _run(out) == 0
    assert len([r["id"] for r in _cell(out).predictions()]) == 2


def test_a_stale_lock_of_a_dead_process_is_reported_and_taken_over(tmp_path, capsys):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).write_text(json.dumps({"pid": gone.pid, "host": os.uname().nodename, "command": "x"}))
    assert _run(out) == 0
    assert f"taking over the lock of pid {gone.pid}, no longer running" in capsys.readouterr().err
    with exclusive(out), pytest.raises(ValueError, match="is being written by pid"), exclusive(out):
        pass


def test_an_output_that_is_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "results.txt"
    target.write_text("mine")
    assert _run(target) == 2
    err = capsys.readouterr().err
    assert f"{target} is a file" in err and len(err.splitlines()) == 1
    assert target.read_text() == "mine"


def test_a_torn_or_edited_complete_cell_is_computed_again_or_refused_with_strict(tmp_path, capsys):
    out = tmp_path / "run"
    assert _run(out) == 0
    reference = _results(out)
    cell = _cell(out)
    text = cell.predictions_path.read_text()
    cell.predictions_path.write_text(text[: len(text) - 40])  # cut mid-line
    assert _run(out, "--strict") == 2
    assert "is not the one its metrics.json was computed from" in capsys.readouterr().err
    assert _run(out) == 0
    assert "computing it again" in capsys.readouterr().err
    assert _results(out) == reference
    records = [json.loads(line) for line in cell.predictions_path.read_text().splitlines()]
    records[0]["prediction"] = "edited"
    cell.predictions_path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert _run(out) == 0 and _results(out) == reference


def test_a_complete_cell_without_config_json_keeps_its_configuration(tmp_path, capsys):
    out = tmp_path / "run"
    assert _run(out) == 0
    (_cell(out).dir / "config.json").unlink()
    assert _run(out, "--seed", "7") == 2
    assert "holds results of another configuration (seed differ)" in capsys.readouterr().err


def test_predictions_without_a_readable_config_are_not_resumed(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["run", "--methods", "full", "--limit", "4", *ARGS, "--output", str(out)]) == 0
    seven = tmp_path / "seven"
    assert cli.main(["run", "--methods", "full", "--limit", "4", *ARGS, "--output", str(seven), "--seed", "7"]) == 0
    cell = _cell(out)
    lines = cell.predictions_path.read_text().splitlines(keepends=True)
    cell.predictions_path.write_text("".join(lines[:2]))  # an interrupted seed-42 cell ...
    cell.metrics_path.unlink()
    (cell.dir / "config.json").write_text("[1, 2]")  # ... whose configuration is unreadable
    assert cli.main(["run", "--methods", "full", "--limit", "4", *ARGS, "--output", str(out), "--seed", "7"]) == 0
    assert "holds predictions without a readable config.json" in capsys.readouterr().err
    assert _results(out) == _results(seven)  # every prediction is seed 7's


def test_zero_samples_is_a_failed_cell(tmp_path, capsys):
    data = tmp_path / "data"
    write_longbench(data, {"hotpotqa_e": []})
    out = tmp_path / "run"
    argv = ["run", "--model", "tiny:qwen3", "--methods", "full", "--tasks", "longbench_e_hotpotqa", "--lengths",
            "1024", "--data-dir", str(data), "--device", "cpu", "--no-progress", "--output", str(out)]
    assert cli.main(argv) == 1
    metrics = json.loads(next(out.glob("*/*/*/*/metrics.json")).read_text())
    assert metrics["status"] == "failed" and "no samples" in metrics["error"]


def test_lengths_beyond_the_models_positions_need_allow_extrapolation(tmp_path, capsys, monkeypatch):
    argv = ["run", "--model", "testbed", "--methods", "full", "--tasks", "testbed_repeat", "--lengths", "8K",
            "--device", "cpu", "--no-progress", "--output", str(tmp_path / "run")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "length 8192 exceeds the 4096 positions testbed was trained for" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()

    def loaded(*args, **kwargs):
        raise ValueError("the model would load now")

    monkeypatch.setattr("elastic_bench.modeling.loading.load_model", loaded)
    assert cli.main([*argv, "--allow-extrapolation"]) == 2
    assert "the model would load now" in capsys.readouterr().err


def test_negative_seed_is_refused(capsys):
    assert cli.main(["run", "--seed", "-5"]) == 2
    assert "seed must be >= 0, got -5" in capsys.readouterr().err


def _wait_for_lock(out: Path, process: subprocess.Popen) -> bool:
    """Wait until the run holds its output folder's lock (it has started its work); False if it ended first."""
    while not (out / LOCK_FILE).exists():
        if process.poll() is not None:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_gives_the_uninterrupted_results(tmp_path):
    """20 SIGKILLs at seeded random moments of a 4-cell run's work, each followed by a resume, end in the same results
    as one uninterrupted run (timing fields aside)."""
    args = ["--methods", "full,streaming", "-O", "streaming.local=128", "--model", "tiny:qwen3", "--tasks",
            "ruler_niah_single_1", "--lengths", "640,768", "--limit", "2", "--device", "cpu", "--no-progress"]
    whole = _subprocess_run(tmp_path / "whole", *args)
    assert _wait_for_lock(tmp_path / "whole", whole)
    began = time.monotonic()
    assert whole.wait(timeout=600) == 0, whole.communicate()
    work = time.monotonic() - began  # the run's time after taking the lock
    rng = random.Random(20261201)
    killed = tmp_path / "killed"
    kills = 0
    while kills < 20:
        process = _subprocess_run(killed, *args)
        if not _wait_for_lock(killed, process):
            break  # nothing left to do
        time.sleep(rng.uniform(0, work / 20))  # 20 kills land within the run's work
        if process.poll() is not None:  # finished before the kill
            assert process.returncode == 0, process.communicate()
            break
        process.send_signal(signal.SIGKILL)
        process.wait()
        kills += 1
    final = _subprocess_run(killed, *args)
    assert final.wait(timeout=600) == 0, final.communicate()
    assert kills == 20
    assert _results(killed) == _results(tmp_path / "whole")


def test_a_router_is_known_by_its_contents_not_its_path(tmp_path, monkeypatch, capsys):
    """The same relative router path in two folders holds two routers: the second run is refused, not reused."""
    import torch

    from elastic_bench.method import RouterConfig, save_routers

    for seed, folder in ((0, tmp_path / "a"), (1, tmp_path / "b")):
        bank = RouterConfig(2, 2, 16, base_model="tiny:qwen3").build()
        generator = torch.Generator().manual_seed(seed)
        for router in bank.layers:
            router.reset_parameters(generator)
        save_routers(bank, folder / "router")
    out = tmp_path / "run"
    argv = ["run", "--methods", "elastic", "-O", "elastic.router=router", "--limit", "1", *ARGS, "--output", str(out)]
    monkeypatch.chdir(tmp_path / "a")
    assert cli.main(argv) == 0
    monkeypatch.chdir(tmp_path / "b")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "holds results of another configuration (artifacts differ)" in err


def test_a_router_moved_elsewhere_with_the_same_contents_is_the_same_configuration(tmp_path, monkeypatch):
    import shutil

    import torch

    from elastic_bench.method import RouterConfig, save_routers

    bank = RouterConfig(2, 2, 16, base_model="tiny:qwen3").build()
    generator = torch.Generator().manual_seed(0)
    for router in bank.layers:
        router.reset_parameters(generator)
    save_routers(bank, tmp_path / "a" / "router")
    out = tmp_path / "run"
    argv = ["run", "--methods", "elastic", "--limit", "1", *ARGS, "--output", str(out)]
    assert cli.main([*argv, "-O", f"elastic.router={tmp_path / 'a' / 'router'}"]) == 0
    shutil.copytree(tmp_path / "a" / "router", tmp_path / "b" / "router")
    metrics = _cell(out, "elastic-router=router").metrics_path
    written = metrics.read_bytes()  # its date and digests would change if the cell were computed again
    assert cli.main([*argv, "-O", f"elastic.router={tmp_path / 'b' / 'router'}"]) == 0
    assert metrics.read_bytes() == written


def test_atomic_writes_give_files_the_usual_mode(tmp_path):
    """The temporary file of an atomic write is private; the result file gets the mode the umask gives."""
    from elastic_bench.foundation.files import write_json

    mask = os.umask(0o022)
    try:
        write_json(tmp_path / "a.json", {"a": 1})
    finally:
        os.umask(mask)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
