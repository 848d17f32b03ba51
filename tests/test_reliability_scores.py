"""A score is computed, never read back (issue 48): a kept or complete prediction's score is computed again from its
prediction and references with its task's scorer, on resume and in ``report``; a score outside the task's range, an
edited line, a line of another sample, an integer id, a nested or huge line are refused or computed again. And the
property: a random edit of any field of any line of an unfinished cell's files, then resume, gives the uninterrupted
run's cell (timing fields aside) or a one-line refusal."""

from __future__ import annotations

import copy
import json
import random
import shutil
import tracemalloc
from pathlib import Path

import pytest
import torch
from fixtures.cli import main, one_line

from elastic_bench import cli
from elastic_bench.results import digests, store
from elastic_bench.results.store import SEAL, Cell, sealed

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

RUN = ["run", "--model", "testbed", "--methods", "full", "--tasks", "testbed_repeat", "--lengths", "128", "--limit",
       "2", "--device", "cpu", "--no-progress"]
# Fields that differ between two identical runs.
TIMING = {"prefill_seconds", "prefill_seconds_median", "decode_seconds", "decode_ms_per_token", "generation_seconds",
          "samples_per_second", "date", "predictions_sha256", "prefill_parts", "prefill_unexplained", SEAL}


def _cell(out: Path) -> Cell:
    return Cell(out, "testbed", "full", "testbed_repeat", 128)


def _text(value) -> str:
    """A JSON value as written, without the fields that differ between identical runs (at any depth)."""
    def clean(v):
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items() if k not in TIMING}
        return [clean(x) for x in v] if isinstance(v, list) else v

    return json.dumps(clean(value))


def _files(cell: Cell) -> dict[str, list[str]]:
    """The cell's files, each JSON value (a line of a .jsonl) as written less its timing fields."""
    return {path.name: [_text(json.loads(line)) for line in path.read_text().splitlines()] if path.suffix == ".jsonl"
            else [_text(json.loads(path.read_text()))] for path in sorted(cell.dir.iterdir())}


@pytest.fixture(scope="module")
def model():
    from elastic_bench.modeling.loading import load_model

    return load_model("testbed", dtype=torch.float32, device="cpu")


@pytest.fixture
def loaded(model, monkeypatch, tmp_path):
    """The runner's model load returns the testbed model loaded once (the rest of the run is the real one)."""
    monkeypatch.setattr("elastic_bench.modeling.loading.load_model", lambda *args, **kwargs: model)
    monkeypatch.setenv(digests.CACHE_VAR, str(tmp_path / "digests"))


@pytest.fixture(scope="module")
def whole(tmp_path_factory, model) -> Path:
    """One uninterrupted run: one cell of two samples, the first scoring 1, the second 0."""
    out = tmp_path_factory.mktemp("whole") / "out"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("elastic_bench.modeling.loading.load_model", lambda *args, **kwargs: model)
        patch.setenv(digests.CACHE_VAR, str(out.parent / "digests"))
        assert cli.main([str(a) for a in [*RUN, "--output", out]]) == 0
    scores = [r["score"] for r in _cell(out).predictions()]
    assert scores == [1.0, 0.0], scores  # the tests below edit a line of each
    return out


def _unfinished(whole: Path, folder: Path, keep: int = 2) -> Cell:
    """A copy of the uninterrupted run as a run killed after ``keep`` predictions (no metrics.json)."""
    shutil.copytree(whole, folder)
    cell = _cell(folder)
    cell.metrics_path.unlink()
    lines = cell.predictions_path.read_text().splitlines(keepends=True)
    cell.predictions_path.write_text("".join(lines[:keep]))
    return cell


def _edit_line(cell: Cell, index: int, reseal: bool = True, **fields) -> None:
    lines = [json.loads(line) for line in cell.predictions_path.read_text().splitlines()]
    record = {k: v for k, v in lines[index].items() if k != SEAL}
    record.update(fields)
    lines[index] = sealed(record) if reseal else {**record, SEAL: lines[index][SEAL]}
    cell.predictions_path.write_text("".join(json.dumps(r) + "\n" for r in lines))


# ---- on resume ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("edit,reason", [
    ({"score": 0.75}, "records the score 0.75 where its prediction scores 1.0"),
    ({"prediction": "I do not know."}, "records the score 1.0 where its prediction scores 0.0"),
    ({"score": 2.625}, "records the score 2.625, outside the task's range [0.0, 1.0]"),
    ({"score": 1}, "records the score 1 where its prediction scores 1.0"),
])
def test_a_kept_line_whose_score_is_not_its_predictions_is_computed_again(whole, tmp_path, loaded, capsys, edit,
                                                                          reason):
    cell = _unfinished(whole, tmp_path / "out")
    _edit_line(cell, 0, **edit)  # sealed again, as a hostile edit would be: the score is computed, not read
    before = _files(cell)
    code, err = main([*RUN, "--output", tmp_path / "out", "--strict"], capsys)
    assert code == 2 and f"line 1 of its predictions.jsonl {reason}" in one_line(err)
    assert _files(cell) == before
    code, err = main([*RUN, "--output", tmp_path / "out"], capsys)
    assert code == 0 and f"{reason}; computing it again" in err
    assert _files(cell) == _files(_cell(whole))


@pytest.mark.parametrize("edit", [{"references": ["moves road rough stops fades duck"]}, {"input_tokens": 7},
                                  {"metadata": {"length": 128, "category": "sensitive"}}, {"id": "5"}])
def test_a_kept_line_that_is_not_its_samples_is_computed_again(whole, tmp_path, loaded, capsys, edit):
    cell = _unfinished(whole, tmp_path / "out")
    _edit_line(cell, 1, **edit)  # the second sample scores 0 whatever its references say
    code, err = main([*RUN, "--output", tmp_path / "out", "--strict"], capsys)
    assert code == 2 and "line 2 of its predictions.jsonl" in one_line(err)
    code, err = main([*RUN, "--output", tmp_path / "out"], capsys)
    assert code == 0 and "computing it again" in err
    assert _files(cell) == _files(_cell(whole))


def test_an_integer_prediction_id_is_not_a_second_prediction_of_its_sample(whole, tmp_path, loaded, capsys):
    cell = _unfinished(whole, tmp_path / "out", keep=1)
    _edit_line(cell, 0, id=0)
    code, err = main([*RUN, "--output", tmp_path / "out"], capsys)
    assert code == 0 and "line 1 of its predictions.jsonl is not a prediction; computing it again" in err
    assert [r["id"] for r in cell.predictions()] == ["0", "1"]
    assert _files(cell) == _files(_cell(whole))


@pytest.mark.parametrize("name", ["predictions.jsonl", "config.json", "metrics.json"])
def test_deeply_nested_json_in_a_cells_files_is_computed_again(whole, tmp_path, loaded, capsys, name):
    shutil.copytree(whole, tmp_path / "out")
    cell = _cell(tmp_path / "out")
    nested = "[" * 200_000 + "]" * 200_000
    path = cell.dir / name
    path.write_text(nested + "\n" if name == "metrics.json" else path.read_text() + nested + "\n")
    if name != "metrics.json":
        cell.metrics_path.unlink()
    code, err = main([*RUN, "--output", tmp_path / "out"], capsys)
    assert code == 0 and "computing it again" in err and "internal error" not in err
    assert _files(cell) == _files(_cell(whole))


def test_a_huge_prediction_line_is_refused_without_being_read_whole(whole, tmp_path, monkeypatch):
    monkeypatch.setattr(store, "MAX_LINE_BYTES", 1 << 20)  # the bound (16 MiB) made small, with the line
    cell = _unfinished(whole, tmp_path / "out")
    lines = cell.predictions_path.read_text().splitlines(keepends=True)
    record = {k: v for k, v in json.loads(lines[1]).items() if k != SEAL}
    cell.predictions_path.write_text(lines[0] + json.dumps(sealed({**record, "prediction": "x" * (8 << 20)})) + "\n")
    tracemalloc.start()
    try:
        reason = cell.verify()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert reason == "line 2 of its predictions.jsonl is longer than 1,048,576 bytes"
    assert peak < 4 << 20  # a bounded read, never the 8 MiB line


# ---- in the report -------------------------------------------------------------------------------------------------


def _reseal_complete(cell: Cell) -> None:
    """Make a complete cell's metrics.json agree with its (edited) predictions: digest, ids and official score."""
    from elastic_bench import tasks

    records = cell.predictions()
    metrics = cell.metrics()
    metrics.update(tasks.get(cell.task).aggregate(records), predictions_sha256=store.digest(cell.predictions_path))
    cell.metrics_path.write_text(json.dumps(metrics))


@pytest.mark.parametrize("edit,reason", [
    ({"score": 2.625}, "records the score 2.625, outside the task's range [0.0, 1.0]"),
    ({"prediction": "I do not know."}, "records the score 1.0 where its prediction scores 0.0"),
])
def test_a_report_computes_every_score_again(whole, tmp_path, capsys, edit, reason):
    from elastic_bench.evaluation.commands import official_scoring
    from elastic_bench.reports import load_cells

    shutil.copytree(whole, tmp_path / "out")
    cell = _cell(tmp_path / "out")
    _edit_line(cell, 0, **edit)
    _reseal_complete(cell)  # a complete cell whose files agree with each other
    (result,) = load_cells(tmp_path / "out", scorings=official_scoring)
    assert not result.complete and f"line 1 of its predictions.jsonl {reason}" in result.error
    code, _ = main(["report", tmp_path / "out"], capsys)
    assert code == 0
    assert reason in (tmp_path / "out" / "report" / "report.md").read_text()


# ---- the property ------------------------------------------------------------------------------------------------

EDITS = 500
VALUES = [None, True, False, 0, 1, -1, 0.0, -0.0, 0.5, 1e300, "", "x", "I do not know.", "0", [], {}, [1, 2],
          {"a": 1}, [[[]]], "\u00e9", 12345678901234567890]


def _paths(value, prefix=()):
    """Every path (keys and indices) to a value inside ``value``, the root included."""
    yield prefix
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield from _paths(item, (*prefix, key))


def _changed(rng: random.Random, value):
    """A value other than ``value``: another type, a neighbour, a mutation."""
    choices = [v for v in VALUES if json.dumps(v) != json.dumps(value)]
    if isinstance(value, bool):
        choices.append(not value)
    elif isinstance(value, int | float):
        choices += [value + 1, value * 2 + 0.5, -value if value else 1, str(value)]
    elif isinstance(value, str):
        choices += [value + " ", value[:-1], value.upper() if value.upper() != value else value + "A", value * 2]
    elif isinstance(value, list) and value:
        choices += [value[:-1], [*value, value[0]], value[::-1] if value[::-1] != value else [*value, None]]
    elif isinstance(value, dict) and value:
        choices.append(dict(list(value.items())[::-1]) if len(value) > 1 else {**value, "extra": 1})
    return copy.deepcopy(rng.choice(choices))


def _edit_json(rng: random.Random, data):
    """``data`` with one random edit: a value replaced, a key removed or added, keys reordered."""
    path = rng.choice(list(_paths(data)))
    if not path:
        return _changed(rng, data)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    kind = rng.choice(["replace", "replace", "replace", "remove", "add"])
    if kind == "remove" and isinstance(parent, dict):
        del parent[path[-1]]
    elif kind == "add" and isinstance(parent, dict):
        parent[rng.choice(["extra", "score", "id", "Score", ""])] = copy.deepcopy(rng.choice(VALUES))
    else:
        parent[path[-1]] = _changed(rng, parent[path[-1]])
    return data


HOSTILE = ["id", "references", "score", "metadata", "input_tokens"]  # what the run checks against its samples


def _edit(rng: random.Random, cell: Cell) -> str:
    """One random edit of the unfinished ``cell``'s files; what it was."""
    config = cell.dir / "config.json"
    lines = cell.predictions_path.read_text().splitlines()
    target = rng.random()
    if target < 0.3:
        config.write_text(json.dumps(_edit_json(rng, json.loads(config.read_text())), indent=2) + "\n")
        return "config.json"
    if target < 0.4:  # the lines themselves
        kind = rng.choice(["drop", "duplicate", "swap", "tear", "garbage", "blank"])
        index = rng.randrange(len(lines))
        if kind == "drop":
            del lines[index]
        elif kind == "duplicate":
            lines.insert(index, lines[index])
        elif kind == "swap":
            lines.reverse()
        elif kind == "garbage":
            lines.insert(index, rng.choice(["{", "[]", "null", "{}", '{"id": "0"}', "\x00"]))
        elif kind == "blank":
            lines.insert(index, "")
        text = "".join(line + "\n" for line in lines)
        cell.predictions_path.write_text(text[: rng.randrange(len(text))] if kind == "tear" else text)
        return f"lines: {kind}"
    index = rng.randrange(len(lines))
    record = json.loads(lines[index])
    if rng.random() < 0.5:  # careless: any field, the seal left as it was
        record = _edit_json(rng, record)
        how = "careless"
    else:  # hostile: a field the run can check, sealed again
        field = rng.choice(HOSTILE)
        record = {k: v for k, v in record.items() if k != SEAL}
        record[field] = _changed(rng, record[field])
        record = sealed(record)
        how = f"hostile {field}"
    lines[index] = json.dumps(record)
    cell.predictions_path.write_text("".join(line + "\n" for line in lines))
    return f"line {index + 1}: {how}"


@pytest.mark.slow
def test_any_edit_of_an_unfinished_cell_resumes_to_the_uninterrupted_cell_or_is_refused(whole, tmp_path, loaded,
                                                                                          capsys, monkeypatch):
    """500 seeded random edits of a field of a line of an unfinished cell's files (the cell killed after both
    predictions, or after the first), each resumed with --strict: the uninterrupted cell or one line refusing it; and
    every 100th resumed without --strict: the uninterrupted cell, computed again where the edit was found. (The writes
    are not flushed to the disk here: durability is not what this tests, and 500 runs write 3000 files.)"""
    monkeypatch.setattr("os.fsync", lambda fd: None)
    expected = _files(_cell(whole))
    rng = random.Random(48)
    outcomes: dict[str, int] = {}
    failures = []
    for index in range(EDITS):
        folder = tmp_path / f"edit{index}"
        cell = _unfinished(whole, folder, keep=2 if rng.random() < 0.95 else 1)
        what = _edit(rng, cell)
        strict = index % 100 != 0
        code, err = main([*RUN, "--output", folder, *(["--strict"] if strict else [])], capsys)
        lines = err.strip().splitlines()
        if code == 2 and strict and len(lines) == 1 and "Traceback" not in err and "internal error" not in err:
            outcomes["refused"] = outcomes.get("refused", 0) + 1
        elif code == 0 and _files(cell) == expected:
            outcomes["resumed"] = outcomes.get("resumed", 0) + 1
        else:
            failures.append(f"edit {index} ({what}, strict={strict}): exit {code}, stderr {err[-300:]!r}")
        shutil.rmtree(folder)
    assert not failures, f"{len(failures)} of {EDITS}:\n" + "\n".join(failures[:20])
    assert outcomes["refused"] > EDITS / 5 and outcomes["resumed"] > EDITS / 5, outcomes
