"""The results store: one folder per cell, ``<root>/<model>/<method>/<task>/<length>/``.

Files: ``config.json`` (what ran), ``predictions.jsonl`` (one line per sample, appended and flushed as it is
scored, so an interrupted cell resumes where it stopped; under ``torchrun`` each rank appends to
``predictions.rank<r>.jsonl`` and rank 0 merges them), ``metrics.json`` (written atomically last; its ``status`` is
``"complete"`` or ``"failed"``). A complete cell is skipped on re-run; a failed one is retried.

A complete cell proves itself: its ``metrics.json`` records the configuration fingerprint it was computed under and
the number, ids and SHA-256 of its predictions, and `Cell.verify` checks them against the files before the cell is
trusted (by the runner before it skips a cell, by the reports before they show one). A score is computed, never read
back: given the task's `Scoring`, every prediction's score is computed again from its prediction and references (and
must lie in the task's range), then the cell's scores from those; the stored scores are a cache that is checked.
Predictions of an interrupted cell are resumed only under a readable ``config.json`` of the same fingerprint, when
every line is a prediction of its own sample id (one line per id) sealed by its ``line_sha256`` (the SHA-256 of the
line without that field, which `Cell.append` adds: an edited line does not match it) and scored as its task scores
it, and (`Cell.kept_problem`) its references, metadata and prompt length are those of its sample. The store follows
no symbolic link in a cell's path (`Cell.check_links`), reads a line at a time and no line or JSON file longer than
`MAX_LINE_BYTES`, and a write that the location refuses (a full disk, a read-only folder) raises
`elastic_bench.foundation.files.StorageError` naming the path. `finished` lists the cells of a run folder that hold
a ``metrics.json``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from elastic_bench.foundation.files import (
    MAX_LINE_BYTES,
    LineTooLongError,
    append_jsonl,
    digest,
    parse_json,
    read_lines,
    storage_errors,
    stray_temporaries,
    write_json,
    write_jsonl,
)

SEAL = "line_sha256"
"""The field of a prediction line that holds the SHA-256 of the line's JSON without it (`sealed`)."""


class Scoring(Protocol):
    """How a task scores its predictions (`elastic_bench.tasks.Task` is one; this layer imports no task).

    Attributes:
        score_range: ``(low, high)``: every per-sample score lies in it.
    """

    score_range: tuple[float, float]

    def rescore(self, record: dict[str, Any]) -> float:
        """The score of a prediction record (a line of ``predictions.jsonl``) computed from its prediction, references
        and metadata."""

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """The cell's scores (``{"score": ..., "score_<breakdown>": ...}``) from its scored records."""


def sealed(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its seal: `SEAL` last, the SHA-256 of ``json.dumps(record)`` (as `append_jsonl` writes it)."""
    return {**record, SEAL: _seal(record)}


def _seal(record: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(record).encode()).hexdigest()


class Cell:
    """The files of one (model, method, task, length) cell."""

    def __init__(self, root: Path | str, model: str, method: str, task: str, length: int):
        self.model, self.method, self.task, self.length = model, method, task, length
        self.root = Path(root)
        self.dir = self.root / model / method / task / str(length)

    @classmethod
    def at(cls, root: Path | str, folder: Path | str) -> Cell:
        """The cell whose folder is ``folder``, ``<root>/<model>/<method>/<task>/<length>``.

        Raises:
            ValueError: ``folder`` is not four levels below ``root`` or its last level is not a length.
        """
        parts = Path(folder).relative_to(root).parts
        if len(parts) != 4 or not parts[3].isdigit():
            raise ValueError(f"{folder} is not a cell folder (<model>/<method>/<task>/<length> under {root})")
        model, method, task, length = parts
        return cls(root, model, method, task, int(length))

    @property
    def metrics_path(self) -> Path:
        return self.dir / "metrics.json"

    @property
    def predictions_path(self) -> Path:
        return self.dir / "predictions.jsonl"

    def metrics(self) -> dict[str, Any] | None:
        """The cell's ``metrics.json``, or None when it is absent or is not a JSON object."""
        return _json_object(self.metrics_path)

    def config(self) -> dict[str, Any] | None:
        """The cell's ``config.json``, or None when it is absent or is not a JSON object."""
        return _json_object(self.dir / "config.json")

    def is_complete(self) -> bool:
        metrics = self.metrics()
        return metrics is not None and metrics.get("status") == "complete"

    def verify(self, scoring: Scoring | None = None) -> str | None:
        """Why the cell's files cannot be trusted (None: they can).

        A complete cell must record its fingerprint and predictions whose ids and SHA-256 are those its
        ``metrics.json`` records; an unfinished cell's predictions must be one sealed JSON object per line (`sealed`)
        with a string id no other line holds, under a ``config.json`` that records its fingerprint. Given its task's
        ``scoring``, every prediction's score must be the one the task computes from the prediction, within the task's
        range, and a complete cell's scores those its aggregation computes from the predictions. A fingerprint that
        differs from the run's is not a reason here but a conflict (`conflict`).
        """
        metrics = self.metrics()
        if self.metrics_path.exists() and metrics is None:
            return "its metrics.json is not readable"
        if metrics is not None and metrics.get("status") == "complete":
            if "fingerprint" not in metrics or "predictions_sha256" not in metrics:
                return "its metrics.json records no fingerprint or predictions digest (an older elastic-bench)"
            if not self.predictions_path.exists() or digest(self.predictions_path) != metrics["predictions_sha256"]:
                return "its predictions.jsonl is not the one its metrics.json was computed from"
            problem = _lines_problem([self.predictions_path], scoring, seals=False)
            if problem:
                return problem
            records = _records(self.predictions_path)
            if [r["id"] for r in records] != metrics.get("prediction_ids"):
                return "its predictions' ids are not those its metrics.json records"
            return None if scoring is None else _rescore(records, metrics, scoring)
        problem = _lines_problem(self._prediction_files(), scoring, seals=True)
        if problem:
            return problem
        if self.predictions() and "fingerprint" not in (self.config() or {}):
            return "it holds predictions without a readable config.json recording their configuration"
        return None

    def kept_problem(self, expected: Mapping[str, Mapping[str, Any]]) -> str | None:
        """Why the predictions kept from an interrupted attempt (checked by `verify`) do not belong to the cell's
        samples (None: they do): ``expected`` holds, for each sample id, the fields its prediction holds as they are
        (JSON values: its references, metadata, prompt length); a prediction of another id, or with one of those fields
        written otherwise, is not one of the samples'."""
        for path in self._prediction_files():
            for number, record in enumerate(_records(path), 1):
                fields = expected.get(record["id"])
                if fields is None:
                    return (f"line {number} of its {path.name} is the prediction of sample {record['id']!r}, which is "
                            "not one of its samples")
                changed = sorted(key for key, value in fields.items()
                                 if json.dumps(record.get(key)) != json.dumps(value))
                if changed:
                    return f"line {number} of its {path.name} differs from its sample in {', '.join(changed)}"
        return None

    def conflict(self, fingerprint: dict[str, Any]) -> list[str]:
        """The fingerprint fields in which the cell's recorded configuration differs from ``fingerprint``, a field it
        lacks included ([]: none, or no fingerprint recorded, which `verify` refuses); an empty or malformed recorded
        fingerprint conflicts as ``["fingerprint"]``."""
        metrics = self.metrics() or {}
        recorded = metrics if metrics.get("status") == "complete" else self.config() or {}
        if "fingerprint" not in recorded:
            return []
        stored = recorded["fingerprint"]
        if not isinstance(stored, dict) or not stored:
            return ["fingerprint"]
        return sorted(k for k in fingerprint if k not in stored or stored[k] != fingerprint[k])

    def check_links(self) -> None:
        """Refuse a cell whose folders below the root, or whose files, include a symbolic link: the store never reads
        or writes through a link, which may lead out of the output folder.

        Raises:
            ValueError: naming the first link.
        """
        folders = [self.root.joinpath(*self.dir.relative_to(self.root).parts[:i]) for i in range(1, 5)]
        files = sorted(self.dir.iterdir()) if self.dir.is_dir() and not self.dir.is_symlink() else []
        for path in [*folders, *files]:
            if path.is_symlink():
                raise ValueError(f"{path} is a symbolic link; elastic-bench writes no cell through a link (replace it "
                                 "with a folder, or use another --output)")

    def remove_temporaries(self) -> None:
        """Delete the temporary files that killed atomic writes left in the cell's folder (only while this process
        holds the output folder's lock: another writer's temporary files are not stray)."""
        with storage_errors(self.dir):
            for path in [self.metrics_path, self.dir / "config.json", self.predictions_path]:
                for stray in stray_temporaries(path):
                    stray.unlink(missing_ok=True)

    def clear(self) -> None:
        """Delete the cell's files (to compute it again)."""
        with storage_errors(self.dir):
            for path in [self.metrics_path, self.dir / "config.json", *self._prediction_files()]:
                path.unlink(missing_ok=True)

    def _prediction_files(self) -> list[Path]:
        return [self.predictions_path, *sorted(self.dir.glob("predictions.rank*.jsonl"))]

    def predictions(self) -> list[dict[str, Any]]:
        """Predictions written so far (rank shards included); a torn last line (an interrupted write) is dropped."""
        return [record for path in self._prediction_files() for record in _records(path)]

    def start(self, config: dict[str, Any]) -> None:
        """Write ``config.json`` and rewrite the predictions kept from an earlier interrupted attempt as one clean
        file."""
        self.remove_temporaries()
        with storage_errors(self.dir):
            self.merge()
            write_json(self.dir / "config.json", config)
            self.metrics_path.unlink(missing_ok=True)

    def append(self, record: dict[str, Any], rank: int | None = None) -> None:
        """Append one prediction, `sealed` (to this rank's shard under ``torchrun``)."""
        with storage_errors(self.dir):
            append_jsonl(self.predictions_path if rank is None else self.dir / f"predictions.rank{rank}.jsonl",
                         sealed(record))

    def merge(self, order: list[str] | None = None) -> list[dict[str, Any]]:
        """Fold rank shards into ``predictions.jsonl`` (sorted by sample ``order`` when given); return the records."""
        records = self.predictions()
        if order is not None:
            position = {sample_id: i for i, sample_id in enumerate(order)}
            records.sort(key=lambda r: position.get(r["id"], len(position)))
        with storage_errors(self.dir):
            write_jsonl(self.predictions_path, records)
            for shard in self._prediction_files()[1:]:
                shard.unlink()
        return records

    def finish(self, metrics: dict[str, Any]) -> None:
        """Write ``metrics.json`` (atomically), with the count, ids and SHA-256 of ``predictions.jsonl``."""
        records = _records(self.predictions_path)
        written = {"num_predictions": len(records), "prediction_ids": [r["id"] for r in records],
                   "predictions_sha256": digest(self.predictions_path) if self.predictions_path.exists() else None}
        with storage_errors(self.dir):
            write_json(self.metrics_path, {**metrics, **written})


def finished(root: Path | str) -> list[Cell]:
    """The cells under ``root`` that hold a ``metrics.json`` (complete or failed; a cell still running holds none),
    sorted by model, method, task and length.

    Raises:
        ValueError: a ``metrics.json`` lies in a folder that is not a cell's (`Cell.at`).
    """
    cells = [Cell.at(root, path.parent) for path in Path(root).glob("*/*/*/*/metrics.json")]
    return sorted(cells, key=lambda c: (c.model, c.method, c.task, c.length))


def _records(path: Path) -> list[dict[str, Any]]:
    """The records of the complete lines of a prediction file ([] when absent): an interrupted append's unended last
    line is dropped (`verify` has checked the others)."""
    if not path.exists():
        return []
    return [parse_json(line) for _, line, ended in read_lines(path, MAX_LINE_BYTES) if ended]


def _lines_problem(paths: list[Path], scoring: Scoring | None, seals: bool) -> str | None:
    """Why the prediction files ``paths`` cannot be trusted (None: they can): a line longer than `MAX_LINE_BYTES`, one
    that is not a JSON object with a string ``id`` (but a torn last line, which an interrupted append leaves), with
    ``seals`` one that does not match its `SEAL`, an id on two lines, or with ``scoring`` a score that is not the
    task's (`_score_problem`)."""
    seen: set[str] = set()
    for path in paths:
        if not path.exists():
            continue
        try:
            for number, line, ended in read_lines(path, MAX_LINE_BYTES):
                if not ended:
                    continue  # torn
                problem = _line_problem(line, scoring, seals, seen)
                if problem:
                    return f"line {number} of its {path.name} {problem}"
        except LineTooLongError as err:
            return f"line {err.number} of its {path.name} is longer than {MAX_LINE_BYTES:,} bytes"
    return None


def _line_problem(line: bytes, scoring: Scoring | None, seals: bool, seen: set[str]) -> str | None:
    try:
        record = parse_json(line)
    except ValueError:
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("id"), str):
        return "is not a prediction"
    if seals and record.pop(SEAL, None) != _seal(record):
        return f"does not match its {SEAL} (an edited line, or one an older elastic-bench wrote)"
    if record["id"] in seen:
        return f"repeats the prediction of sample {record['id']}"
    seen.add(record["id"])
    return None if scoring is None else _score_problem(record, scoring)


def _score_problem(record: dict[str, Any], scoring: Scoring) -> str | None:
    """Why a prediction's recorded score is not the one its task gives it (None: it is): outside the task's range, or
    not what `Scoring.rescore` computes from its prediction and references."""
    low, high = scoring.score_range
    stored = record.get("score")
    if isinstance(stored, bool) or not isinstance(stored, int | float) or not low <= stored <= high:
        return f"records the score {stored!r}, outside the task's range [{low}, {high}]"
    try:
        computed = scoring.rescore(record)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ArithmeticError) as err:
        return f"cannot be scored ({type(err).__name__}: {err})"
    if json.dumps(computed) != json.dumps(stored):  # as written: 1 is not 1.0, nor -0.0 0.0
        return f"records the score {stored!r} where its prediction scores {computed!r}"
    return None


def _rescore(records: list[dict[str, Any]], metrics: dict[str, Any], scoring: Scoring) -> str | None:
    """Why the scores ``metrics`` records are not those the task's aggregation computes from ``records`` (None: they
    are)."""
    try:
        scores = json.loads(json.dumps(scoring.aggregate(records), default=str))
    except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as err:
        return f"its predictions cannot be scored ({type(err).__name__}: {err})"
    changed = sorted(k for k in scores if not _same(metrics.get(k), scores[k]))
    if changed:
        return f"its metrics.json records scores its predictions do not give ({', '.join(changed)})"
    return None


def _same(recorded: Any, computed: Any) -> bool:
    """Whether a recorded score is the computed one; NaN (an empty bucket's score) is the same as NaN."""
    nan = [isinstance(v, float) and math.isnan(v) for v in (recorded, computed)]
    return recorded == computed or all(nan)


def _json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it is absent, larger than `MAX_LINE_BYTES`, or not a JSON object."""
    try:
        if path.stat().st_size > MAX_LINE_BYTES:
            return None
        data = parse_json(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


IN_DISTRIBUTION, ALLOWED = "†", "‡"
"""How tables mark a cell that a learned file of its method was trained on (its ``metrics.json`` records a non-empty
``in_distribution``): ``†``, or ``‡`` where the run was told to score such cells (``allow_in_distribution``)."""


def in_distribution_mark(in_distribution: Any, allowed: bool) -> str:
    """The mark of a cell whose ``metrics.json`` records ``in_distribution`` (a list of findings; empty or missing:
    held out) and ``allow_in_distribution`` = ``allowed``: "" for a held-out cell."""
    return (ALLOWED if allowed else IN_DISTRIBUTION) if in_distribution else ""
