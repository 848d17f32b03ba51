"""The results store: one folder per cell, ``<root>/<model>/<method>/<task>/<length>/``.

Files: ``config.json`` (what ran), ``predictions.jsonl`` (one line per sample, appended and flushed as it is
scored, so an interrupted cell resumes where it stopped; under ``torchrun`` each rank appends to
``predictions.rank<r>.jsonl`` and rank 0 merges them), ``metrics.json`` (written atomically last; its ``status`` is
``"complete"`` or ``"failed"``). A complete cell is skipped on re-run; a failed one is retried.

A complete cell proves itself: its ``metrics.json`` records the configuration fingerprint it was computed under and
the number, ids and SHA-256 of its predictions, and `Cell.verify` checks them against the files before the cell is
trusted (by the runner before it skips a cell, by the reports before they show one); given the task's aggregation,
it also recomputes the scores from the predictions. Predictions of an interrupted cell are resumed only under a
readable ``config.json`` of the same fingerprint, when every line is a prediction of its own sample id (one line per
id). The store follows no symbolic link in a cell's path (`Cell.check_links`), and a write that the location refuses
(a full disk, a read-only folder) raises `StorageError` naming the path. `finished` lists the cells of a run folder
that hold a ``metrics.json``.
"""

from __future__ import annotations

import errno
import json
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from elastic_bench.foundation.files import (
    append_jsonl,
    digest,
    read_jsonl,
    stray_temporaries,
    write_json,
    write_jsonl,
)

# Errors of a location that cannot take the results (no space, over quota, read-only, forbidden): the user's to fix.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


class StorageError(ValueError):
    """The output location refuses a write (a full disk, a read-only or forbidden folder); what was written before
    is kept."""


@contextmanager
def _writing(folder: Path) -> Iterator[None]:
    """Turn an `OSError` of `STORAGE_ERRNOS` raised in the block into a `StorageError` naming the path."""
    try:
        yield
    except OSError as err:
        if err.errno not in STORAGE_ERRNOS:
            raise
        raise StorageError(f"cannot write {err.filename or folder}: {err.strerror}; the results written so far are "
                           "kept") from None


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

    def verify(self, aggregate: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None) -> str | None:
        """Why the cell's files cannot be trusted (None: they can).

        A complete cell must record its fingerprint and predictions whose ids and SHA-256 are those its
        ``metrics.json`` records, and, given its task's ``aggregate``, the scores that ``aggregate`` computes from
        those predictions; an unfinished cell's predictions must be one JSON object per line with an id no other line
        holds, under a ``config.json`` that records its fingerprint. A fingerprint that differs from the run's is not
        a reason here but a conflict (`conflict`).
        """
        metrics = self.metrics()
        if self.metrics_path.exists() and metrics is None:
            return "its metrics.json is not readable"
        if metrics is not None and metrics.get("status") == "complete":
            if "fingerprint" not in metrics or "predictions_sha256" not in metrics:
                return "its metrics.json records no fingerprint or predictions digest (an older elastic-bench)"
            if not self.predictions_path.exists() or digest(self.predictions_path) != metrics["predictions_sha256"]:
                return "its predictions.jsonl is not the one its metrics.json was computed from"
            records = read_jsonl(self.predictions_path)
            ids = [r.get("id") if isinstance(r, dict) else None for r in records]
            if ids != metrics.get("prediction_ids") or len(set(map(str, ids))) != len(ids):
                return "its predictions' ids are not those its metrics.json records"
            return None if aggregate is None else _rescore(records, metrics, aggregate)
        problem = _lines_problem(self._prediction_files())
        if problem:
            return problem
        if self.predictions() and "fingerprint" not in (self.config() or {}):
            return "it holds predictions without a readable config.json recording their configuration"
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
        with _writing(self.dir):
            for path in [self.metrics_path, self.dir / "config.json", self.predictions_path]:
                for stray in stray_temporaries(path):
                    stray.unlink(missing_ok=True)

    def clear(self) -> None:
        """Delete the cell's files (to compute it again)."""
        with _writing(self.dir):
            for path in [self.metrics_path, self.dir / "config.json", *self._prediction_files()]:
                path.unlink(missing_ok=True)

    def _prediction_files(self) -> list[Path]:
        return [self.predictions_path, *sorted(self.dir.glob("predictions.rank*.jsonl"))]

    def predictions(self) -> list[dict[str, Any]]:
        """Predictions written so far (rank shards included); a torn last line (an interrupted write) is dropped."""
        return [record for path in self._prediction_files() for record in read_jsonl(path)]

    def start(self, config: dict[str, Any], sample_ids: Iterable[str]) -> str | None:
        """Write ``config.json`` and rewrite the predictions kept from an earlier interrupted attempt as one clean
        file; predictions of an id not among ``sample_ids`` discard them all (the cell is computed again). Returns
        why they were discarded (None: kept, or none)."""
        self.remove_temporaries()
        with _writing(self.dir):
            records = self.merge()
            foreign = sorted({str(r["id"]) for r in records} - set(map(str, sample_ids)))
            discarded = None
            if foreign:
                discarded = f"its predictions.jsonl holds ids that are not its samples' ({', '.join(foreign[:3])})"
                self.clear()
            write_json(self.dir / "config.json", config)
            self.metrics_path.unlink(missing_ok=True)
        return discarded

    def append(self, record: dict[str, Any], rank: int | None = None) -> None:
        """Append one prediction (to this rank's shard under ``torchrun``)."""
        with _writing(self.dir):
            append_jsonl(self.predictions_path if rank is None else self.dir / f"predictions.rank{rank}.jsonl", record)

    def merge(self, order: list[str] | None = None) -> list[dict[str, Any]]:
        """Fold rank shards into ``predictions.jsonl`` (sorted by sample ``order`` when given); return the records."""
        records = self.predictions()
        if order is not None:
            position = {sample_id: i for i, sample_id in enumerate(order)}
            records.sort(key=lambda r: position.get(r["id"], len(position)))
        with _writing(self.dir):
            write_jsonl(self.predictions_path, records)
            for shard in self._prediction_files()[1:]:
                shard.unlink()
        return records

    def finish(self, metrics: dict[str, Any]) -> None:
        """Write ``metrics.json`` (atomically), with the count, ids and SHA-256 of ``predictions.jsonl``."""
        records = read_jsonl(self.predictions_path)
        written = {"num_predictions": len(records), "prediction_ids": [r["id"] for r in records],
                   "predictions_sha256": digest(self.predictions_path) if self.predictions_path.exists() else None}
        with _writing(self.dir):
            write_json(self.metrics_path, {**metrics, **written})


def finished(root: Path | str) -> list[Cell]:
    """The cells under ``root`` that hold a ``metrics.json`` (complete or failed; a cell still running holds none),
    sorted by model, method, task and length.

    Raises:
        ValueError: a ``metrics.json`` lies in a folder that is not a cell's (`Cell.at`).
    """
    cells = [Cell.at(root, path.parent) for path in Path(root).glob("*/*/*/*/metrics.json")]
    return sorted(cells, key=lambda c: (c.model, c.method, c.task, c.length))


def _lines_problem(paths: list[Path]) -> str | None:
    """Why the prediction files ``paths`` of an unfinished cell cannot be resumed (None: they can): a line that is not
    a JSON object with an ``id`` (but a torn last line, which an interrupted append leaves and `read_jsonl` drops), or
    an id on two lines."""
    seen: set[str] = set()
    for path in paths:
        if not path.exists():
            continue
        text = path.read_text(errors="replace")
        lines = text.splitlines()
        if lines and not text.endswith("\n"):
            lines = lines[:-1]  # torn
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if not isinstance(record, dict) or not isinstance(record.get("id"), str | int):
                return f"line {number} of its {path.name} is not a prediction"
            if str(record["id"]) in seen:
                return f"line {number} of its {path.name} repeats the prediction of sample {record['id']}"
            seen.add(str(record["id"]))
    return None


def _rescore(records: list[dict[str, Any]], metrics: dict[str, Any],
             aggregate: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> str | None:
    """Why the scores ``metrics`` records are not those ``aggregate`` computes from ``records`` (None: they are)."""
    try:
        scores = json.loads(json.dumps(aggregate(records), default=str))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as err:
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
    try:
        data = json.loads(path.read_text())
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
