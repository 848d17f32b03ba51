"""A cell's files are checked, not trusted: malformed, duplicated or foreign prediction lines, edited scores, empty
fingerprints, symbolic links, stray temporary files and a location that refuses writes."""

from __future__ import annotations

import errno
import json
import math
import shutil
from pathlib import Path

import pytest

from elastic_bench import cli
from elastic_bench.results import store
from elastic_bench.results.store import Cell

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ARGS = ["run", "--methods", "full", "--limit", "2", "--model", "tiny:qwen3", "--tasks", "ruler_niah_single_1",
        "--lengths", "640", "--device", "cpu", "--no-progress"]


def _run(out: Path) -> int:
    return cli.main([*ARGS, "--output", str(out)])


def _cell(out: Path) -> Cell:
    return Cell(out, "tiny-qwen3", "full", "ruler_niah_single_1", 640)


@pytest.fixture(scope="module")
def computed(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("computed") / "out"
    assert _run(out) == 0
    return out


@pytest.fixture
def out(computed: Path, tmp_path: Path) -> Path:
    """A copy of a complete run folder."""
    copy = tmp_path / "out"
    shutil.copytree(computed, copy)
    return copy


def _lines(cell: Cell) -> list[str]:
    return cell.predictions_path.read_text().splitlines(keepends=True)


@pytest.mark.parametrize("tamper", ["duplicated", "foreign", "malformed", "no id"])
def test_bad_prediction_lines_of_an_unfinished_cell_compute_it_again(out, computed, tamper, capsys):
    cell = _cell(out)
    lines = _lines(cell)
    cell.metrics_path.unlink()  # an interrupted cell
    if tamper == "duplicated":
        lines.insert(1, lines[0])
    elif tamper == "foreign":
        lines.append(json.dumps({**json.loads(lines[0]), "id": "999"}) + "\n")
    elif tamper == "malformed":
        lines.insert(1, "{not json\n")
    else:
        lines.insert(1, "[1, 2]\n")
    cell.predictions_path.write_text("".join(lines))
    capsys.readouterr()
    assert _run(out) == 0
    messages = [line for line in capsys.readouterr().err.splitlines() if "computing it again" in line]
    assert len(messages) == 1 and str(cell.dir) in messages[0]
    assert cell.verify() is None and cell.is_complete()
    expected = _cell(computed).metrics()
    assert cell.metrics()["prediction_ids"] == expected["prediction_ids"]
    assert cell.metrics()["score"] == expected["score"]


@pytest.mark.parametrize("score", [0.5, math.nan])
def test_an_edited_score_computes_the_cell_again(out, computed, score, capsys):
    cell = _cell(out)
    metrics = cell.metrics()
    cell.metrics_path.write_text(json.dumps({**metrics, "score": score}))
    capsys.readouterr()
    assert _run(out) == 0
    assert "scores its predictions do not give (score); computing it again" in capsys.readouterr().err
    assert cell.metrics()["score"] == _cell(computed).metrics()["score"]


def test_an_empty_buckets_nan_score_proves_itself(out):
    cell = _cell(out)
    metrics = cell.metrics()
    cell.metrics_path.write_text(json.dumps({**metrics, "score_8k+": math.nan}))

    class Buckets:  # an official scoring with a bucket no sample falls in
        score_range = (0.0, 1.0)

        def rescore(self, record):
            return record["score"]

        def aggregate(self, records):
            return {"score": metrics["score"], "score_8k+": math.nan}

    assert cell.verify(Buckets()) is None
    cell.metrics_path.write_text(json.dumps({**metrics, "score_8k+": 12.5}))
    assert "scores its predictions do not give (score_8k+)" in cell.verify(Buckets())


@pytest.mark.parametrize("score", [0.5, math.nan])
def test_a_report_given_the_tasks_scorings_refuses_an_edited_score(out, score):
    from elastic_bench.evaluation.commands import official_scoring
    from elastic_bench.reports import load_cells

    (proven,) = load_cells(out, scorings=official_scoring)
    assert proven.complete and proven.score == _cell(out).metrics()["score"]
    cell = _cell(out)
    cell.metrics_path.write_text(json.dumps({**cell.metrics(), "score": score}))
    (edited,) = load_cells(out, scorings=official_scoring)
    assert not edited.complete and "scores its predictions do not give (score)" in edited.error


@pytest.mark.parametrize("fingerprint", [{}, [], "seed 42"])
@pytest.mark.parametrize("complete", [True, False])
def test_an_empty_or_malformed_fingerprint_is_a_conflict(out, fingerprint, complete, capsys):
    cell = _cell(out)
    path = cell.metrics_path if complete else cell.dir / "config.json"
    if not complete:
        cell.metrics_path.unlink()
    path.write_text(json.dumps({**json.loads(path.read_text()), "fingerprint": fingerprint}))
    before = {p.name: p.read_bytes() for p in cell.dir.iterdir()}
    capsys.readouterr()
    assert _run(out) == 2
    err = capsys.readouterr().err.strip()
    assert "another configuration (fingerprint differ)" in err and len(err.splitlines()) == 1
    assert {p.name: p.read_bytes() for p in cell.dir.iterdir()} == before


@pytest.mark.parametrize("level", ["cell", "task"])
def test_a_symbolic_link_in_a_cell_path_is_refused(out, tmp_path, level, capsys):
    cell = _cell(out)
    link = cell.dir if level == "cell" else cell.dir.parent
    outside = tmp_path / "outside"
    shutil.move(link, outside)
    link.symlink_to(outside, target_is_directory=True)
    (cell.dir / "metrics.json").write_text("not json")  # would be "computed again" through the link
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert _run(out) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"elastic-bench: error: {link} is a symbolic link; elastic-bench writes no cell through a link " \
                  "(replace it with a folder, or use another --output)"
    assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == before


def test_stray_temporary_files_are_removed_and_the_cell_kept(out):
    cell = _cell(out)
    strays = [cell.dir / ".metrics.json.k1l2m3.tmp", cell.dir / ".predictions.jsonl.x9y8.tmp"]
    for stray in strays:
        stray.write_text("half a write")
    other = cell.dir / "notes.tmp"  # not a temporary file of an atomic write
    other.write_text("mine")
    before = cell.metrics_path.read_bytes()
    assert _run(out) == 0
    assert not any(stray.exists() for stray in strays) and other.exists()
    assert cell.metrics_path.read_bytes() == before  # verified, not computed again


@pytest.mark.parametrize(("target", "code"), [("write_json", errno.ENOSPC), ("append_jsonl", errno.EROFS)])
def test_a_location_that_refuses_writes_is_a_user_error(tmp_path, monkeypatch, capsys, target, code):
    out = tmp_path / "out"

    def refuse(*args, **kwargs):
        raise OSError(code, "refused")

    monkeypatch.setattr(store, target, refuse)
    capsys.readouterr()
    assert _run(out) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"elastic-bench: error: cannot write {_cell(out).dir}: refused; the results written so far are kept"
    assert not _cell(out).metrics_path.exists()  # not recorded as a failed cell


def test_an_oserror_of_a_read_only_location_outside_the_store_is_a_user_error(monkeypatch, capsys):
    def refuse(command, args):
        raise OSError(errno.EROFS, "Read-only file system", "/results/.elastic-bench.lock")

    monkeypatch.setattr(cli.Command, "handler", property(lambda self: refuse), raising=False)
    assert cli.main(["methods"]) == 2
    assert capsys.readouterr().err.strip() == \
        "elastic-bench: error: [Errno 30] Read-only file system: '/results/.elastic-bench.lock'"
