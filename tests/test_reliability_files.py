"""Locks that cannot be turned against the user, temporary files that do not outlive a kill, refused writes named
before the work or at the file, and values read as the data they claim to be (issue 48)."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from fixtures.cli import main, one_line, tiny_run

from elastic_bench.foundation.files import LOCK_FILE, digest, exclusive

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


# ---- the lock ------------------------------------------------------------------------------------------------------

# Every command that locks its output folder, with arguments that reach the lock before any model loads.
WRITERS = {
    "run": tiny_run("{out}"),
    "train-router": ["train-router", "--model", "tiny:qwen3", "--data", "synthetic", "--steps", "1", "--device", "cpu",
                     "--output", "{out}"],
    "train-duo": ["train-duo", "--model", "tiny:qwen3", "--steps", "1", "--device", "cpu", "--output", "{out}"],
    "train-prulong": ["train-prulong", "--model", "tiny:qwen3", "--steps", "1", "--device", "cpu", "--output", "{out}"],
    "testbed train": ["testbed", "train", "--steps", "1", "--device", "cpu", "--output", "{out}"],
}


@pytest.mark.parametrize("command", sorted(WRITERS))
@pytest.mark.parametrize("dangling", [False, True], ids=["link", "dangling link"])
def test_a_lock_file_that_is_a_link_is_refused_and_nothing_is_written_through_it(tmp_path, capsys, no_model, command,
                                                                                  dangling):
    out, target = tmp_path / "out", tmp_path / "elsewhere.txt"
    out.mkdir()
    if not dangling:
        target.write_text("the user's file")
    (out / LOCK_FILE).symlink_to(target)
    code, err = main([w.format(out=out) for w in WRITERS[command]], capsys)  # a dangling link once spun forever
    assert code == 2 and f"{out / LOCK_FILE} is a symbolic link; elastic-bench takes no lock through a link" in \
        one_line(err)
    assert target.read_text() == "the user's file" if not dangling else not target.exists()
    assert (out / LOCK_FILE).is_symlink()


def test_a_dangling_link_lock_stops_at_once_in_a_process_of_its_own(tmp_path):
    (tmp_path / LOCK_FILE).symlink_to(tmp_path / "nowhere")
    code = f"from elastic_bench.foundation.files import exclusive\nwith exclusive({str(tmp_path)!r}): pass"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "is a symbolic link" in done.stderr
    assert not (tmp_path / "nowhere").exists()


def test_a_lock_file_that_is_a_fifo_or_a_folder_is_refused(tmp_path):
    os.mkfifo(tmp_path / LOCK_FILE)
    with pytest.raises(ValueError, match="is not a regular file"), exclusive(tmp_path):
        pass
    os.unlink(tmp_path / LOCK_FILE)
    (tmp_path / LOCK_FILE).mkdir()
    with pytest.raises(OSError), exclusive(tmp_path):
        pass


def test_a_lock_naming_pid_zero_or_a_negative_pid_is_stale(tmp_path, capsys):
    for pid in (0, -1):
        (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
        with exclusive(tmp_path):
            pass
        assert f"taking over the lock of pid {pid}, no longer running" in capsys.readouterr().err


# ---- temporary files -----------------------------------------------------------------------------------------------


def test_held_copies_left_by_killed_runs_are_removed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    host = socket.gethostname()
    stale = tmp_path / "tmp" / f"elastic-bench-held-{_dead_pid()}-{host}.ab12cd34"
    live = tmp_path / "tmp" / f"elastic-bench-held-{os.getppid()}-{host}.ef56gh78"  # a process that lives
    other = tmp_path / "tmp" / f"elastic-bench-held-{_dead_pid()}-another-host.ij90kl12"  # cannot be checked here
    for folder in (stale, live, other):
        (folder / "0" / "router").mkdir(parents=True)
    code, err = main(tiny_run(tmp_path / "out", "--methods", "elastic", "-O", "elastic.router=untrained"), capsys)
    assert code == 0 and f"removed {stale}, the learned files held by a run that was killed" in err
    assert not stale.exists() and live.exists() and other.exists()
    assert sorted((tmp_path / "tmp").glob("elastic-bench-held-*")) == sorted([live, other])  # its own gone too


def test_a_killed_runs_held_copies_are_removed_by_the_next_run(tmp_path):
    """A real kill: the run is SIGKILLed while it holds its copies; the next run removes them."""
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "OMP_NUM_THREADS": "1"}
    (tmp_path / "tmp").mkdir()
    argv = [sys.executable, "-m", "elastic_bench", *map(str, tiny_run(tmp_path / "out", "--methods", "elastic", "-O",
                                                                      "elastic.router=untrained", "--limit", "3"))]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not (tmp_path / "out" / LOCK_FILE).exists():  # it holds its copies from before it takes the lock
            assert process.poll() is None
            time.sleep(0.02)
        held = list((tmp_path / "tmp").glob("elastic-bench-held-*"))
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert len(held) == 1 and held[0].exists()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert not held[0].exists() and not list((tmp_path / "tmp").glob("elastic-bench-held-*"))


def test_a_killed_reports_temporary_files_are_removed(tmp_path, capsys):
    from test_reports import _cell

    _cell(tmp_path / "run", "full", "ruler_niah_single_1", 1024, 50.0, 0.0, 1.0)
    report = tmp_path / "run" / "report"
    report.mkdir()
    strays = [report / ".report.md.k1l2m3n4.tmp", report / ".m-summary-frontier-esr.png.abcd_123.tmp"]
    for stray in strays:
        stray.write_text("half a write")
    mine = report / "notes.tmp"
    mine.write_text("not an atomic write's")
    code, _ = main(["report", tmp_path / "run"], capsys)
    assert code == 0 and not any(s.exists() for s in strays) and mine.exists()
    assert not (report / LOCK_FILE).exists()


# ---- refused writes: before the work, and at the file ----------------------------------------------------------------


def _refusing(monkeypatch, folder: Path, code: int = errno.EROFS) -> None:
    """Every new file in ``folder`` refused as a read-only file system refuses it (the tests run as root, whom a
    read-only mode does not stop)."""
    import tempfile as module

    made = module.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).resolve() == folder.resolve():
            raise OSError(code, os.strerror(code), str(dir))
        return made(*args, dir=dir, **kwargs)

    monkeypatch.setattr(module, "mkstemp", mkstemp)


class Reached(BaseException):
    pass


def _reached(monkeypatch, target: str) -> None:
    def stop(*args, **kwargs):
        raise Reached(target)

    monkeypatch.setattr(target, stop)


@pytest.mark.parametrize("command,work", [
    (["records", "--model", "tiny:qwen3", "--samples", "1"], "elastic_bench.method.router_records.make_router_records"),
    (["bench", "kernel", "--lengths", "256", "--device", "cpu"], "elastic_bench.kernels.bench.run_kernel_bench"),
    (["report", "{run}"], "elastic_bench.reports.summarize"),
])
def test_a_read_only_output_is_refused_before_the_work(tmp_path, capsys, monkeypatch, command, work):
    from test_reports import _cell

    _cell(tmp_path / "run", "full", "ruler_niah_single_1", 1024, 50.0, 0.0, 1.0)
    out = tmp_path / "read-only"
    out.mkdir()
    _refusing(monkeypatch, out)
    _reached(monkeypatch, work)
    target = out if command[0] == "report" else out / "out.json"
    code, err = main([*(w.format(run=tmp_path / "run") for w in command), "--output", target], capsys)
    assert code == 2 and one_line(err) == (f"elastic-bench: error: cannot write {out}: Read-only file system; the "
                                           "results written so far are kept")


def test_a_full_disk_in_report_and_records_names_the_file(tmp_path, capsys, monkeypatch):
    from test_reports import _cell

    _cell(tmp_path / "run", "full", "ruler_niah_single_1", 1024, 50.0, 0.0, 1.0)
    real = Path.write_text

    def full(self, *args, **kwargs):
        if self.name.endswith(".tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")  # as write() raises it: no file named
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    code, err = main(["report", tmp_path / "run"], capsys)
    assert code == 2 and one_line(err) == (f"elastic-bench: error: cannot write {tmp_path / 'run' / 'report'}/"
                                           "report.md: No space left on device; the results written so far are kept")
    code, err = main(["records", "--model", "tiny:qwen3", "--samples", "1", "--lengths", "1K", "--tasks",
                      "passkey,repeat", "--no-progress", "--output", tmp_path / "r.jsonl"], capsys)
    assert code == 2 and f"cannot write {tmp_path / 'r.jsonl'}: No space left on device" in one_line(err)
    assert not list(tmp_path.glob(".r.jsonl.*"))


@pytest.mark.slow
def test_a_full_disk_in_train_router_is_one_line_naming_the_file(tmp_path):
    """safetensors' writer reports the disk's refusal as its own error; it is named like any other refused write (a
    file-size limit stands for the full disk)."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    out = tmp_path / "out"
    argv = [sys.executable, "-m", "elastic_bench", "train-router", "--model", "tiny:qwen3", "--data", "synthetic",
            "--synthetic-samples", "4", "--synthetic-length", "150", "--steps", "1", "--rows-per-step", "1",
            "--pack-tokens", "1024", "--eval-samples", "1", "--sink", "4", "--local-window", "32", "--granularity",
            "token", "--device", "cpu", "--no-progress", "--output", str(out)]
    done = subprocess.run(argv, preexec_fn=limit, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert lines[-1].startswith(f"elastic-bench: error: cannot write {out}/") and "File too large" in lines[-1]
    assert "Traceback" not in done.stderr and not list(out.glob(".*.tmp"))


# ---- values: the option's type, the environment, lengths -----------------------------------------------------------


def test_an_option_path_holding_a_hash_stays_that_path(tmp_path, capsys):
    gates = tmp_path / "gates"
    gates.mkdir()
    (gates / "g.tsv").write_text("\n".join(["1\t0"] * 6) + "\n")
    (gates / "g.tsv #2").write_text("\n".join(["0\t1"] * 6) + "\n")  # a comment to YAML, part of the name here
    argv = ["run", "--model", "testbed", "--methods", "duo_attention", "-O", f"duo_attention.pattern={gates}/g.tsv #2",
            "--tasks", "testbed_repeat", "--lengths", "128", "--limit", "1", "--device", "cpu", "--no-progress",
            "--output", tmp_path / "out"]
    code, _ = main(argv, capsys)
    (metrics,) = (tmp_path / "out").glob("*/*/*/*/metrics.json")
    assert code == 0 and json.loads(metrics.read_text())["fingerprint"]["artifacts"] == \
        {"pattern": digest(gates / "g.tsv #2")}


@pytest.mark.parametrize("environment,message", [
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE is 2 but RANK is not set: start the processes with torchrun"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE must be a whole number >= 1 (torchrun sets it), got 'two'"),
    ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK must be a whole number [0, 1] (torchrun sets it), got '2'"),
    ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "-1"}, "LOCAL_RANK must be a whole number >= 0"),
])
def test_a_torchrun_environment_torchrun_would_never_set_is_one_line(tmp_path, capsys, no_model, monkeypatch,
                                                                     environment, message):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    for argv in (tiny_run(tmp_path / "out"), WRITERS["train-router"]):
        code, err = main([str(w).format(out=tmp_path / "train") for w in argv], capsys)
        assert code == 2 and message in one_line(err)
    assert not (tmp_path / "out").exists()


def test_records_with_a_min_length_below_every_record_is_one_line(tmp_path, capsys):
    code, err = main(["records", "--model", "tiny:qwen3", "--min-length", "2", "--max-length", "8", "--samples", "1",
                      "--no-progress", "--output", tmp_path / "r.jsonl"], capsys)
    assert code == 2 and "no sensitive task fits a length of 2 tokens" in one_line(err)
    assert "their smallest records take: single_qa" in err and not (tmp_path / "r.jsonl").exists()


def test_frequent_words_at_a_length_too_short_is_refused_with_its_minimum(tmp_path, capsys, no_model):
    code, err = main(tiny_run(tmp_path / "out")[:-4] + ["--tasks", "ruler_fwe", "--lengths", "100", "--output",
                                                        tmp_path / "out"], capsys)
    assert code == 2 and "ruler_fwe: a target length of 100 tokens is too short" in one_line(err)


def test_a_negative_knob_through_lm_eval_names_its_range(no_model):
    pytest.importorskip("lm_eval")
    from elastic_bench.evaluation.lm_eval_bridge import build_method

    with pytest.raises(ValueError, match=r"^streaming.local must be >= 1, got -1$"):
        build_method("streaming", {"method_local": -1.0})  # lm-eval's parser reads -1 as -1.0
    assert build_method("streaming", {"method_local": 64.0}).local == 64
    with pytest.raises(ValueError, match="method_local must be an integer, got 2.5"):
        build_method("streaming", {"method_local": 2.5})


# ---- gate files: checked once, before the model loads ---------------------------------------------------------------


@pytest.mark.parametrize("content,message", [
    ("1\tx\n0\t1\n", "is not a tab-separated table of numbers"),
    ("1\t0\n0\t1\n", "head gates in {path} are 2 layers × 2 KV heads; the model has 6 layers × 2 KV heads"),
])
def test_a_bad_gate_file_is_refused_before_the_model_loads(tmp_path, capsys, no_model, content, message):
    path = tmp_path / "gates.tsv"
    path.write_text(content)
    code, err = main(["run", "--model", "testbed", "--methods", "duo_attention", "-O", f"duo_attention.pattern={path}",
                      "--tasks", "testbed_repeat", "--lengths", "128", "--device", "cpu", "--output",
                      tmp_path / "out"], capsys)
    assert code == 2 and message.format(path=path) in one_line(err)


def test_gates_are_read_once_per_run_not_per_cell(tmp_path, capsys, monkeypatch):
    from elastic_bench.baselines import gates

    read = []
    load = gates.load_gates
    monkeypatch.setattr(gates, "load_gates", lambda path: read.append(path) or load(path))
    code, _ = main(["run", "--model", "testbed", "--methods", "duo_attention", "--tasks",
                    "testbed_repeat,testbed_niah_single", "--lengths", "128,160", "--limit", "1", "--device", "cpu",
                    "--no-progress", "--output", tmp_path / "out"], capsys)
    assert code == 0 and len(list((tmp_path / "out").glob("*/*/*/*/metrics.json"))) == 4
    assert len(read) <= 3  # the option's file, and the run's copy of it: not twice per cell
