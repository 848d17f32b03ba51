"""The results store: one folder per cell, ``<root>/<model>/<method>/<task>/<length>/``.

Files: ``config.json`` (what ran), ``predictions.jsonl`` (one line per sample, appended and flushed as it is
scored, so an interrupted cell resumes where it stopped; under ``torchrun`` each rank appends to
``predictions.rank<r>.jsonl`` and rank 0 merges them), ``metrics.json`` (written atomically last; its ``status`` is
``"complete"`` or ``"failed"``). A complete cell is skipped on re-run; a failed one is retried.

A complete cell proves itself: its ``metrics.json`` records the configuration fingerprint it was computed under and
the number, ids and SHA-256 of its predictions, and `Cell.verify` checks them against the files before the cell is
trusted (by the runner before it skips a cell, by the reports before they show one). Predictions of an interrupted
cell are resumed only under a readable ``config.json`` of the same fingerprint. `finished` lists the cells of a run
folder that hold a ``metrics.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from elastic_bench.foundation.files import append_jsonl, digest, read_jsonl, write_json, write_jsonl


class Cell:
    """The files of one (model, method, task, length) cell."""

    def __init__(self, root: Path | str, model: str, method: str, task: str, length: int):
        self.model, self.method, self.task, self.length = model, method, task, length
        self.dir = Path(root) / model / method / task / str(length)

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

    def verify(self) -> str | None:
        """Why the cell's files cannot be trusted (None: they can).

        A complete cell must record its fingerprint and predictions whose ids and SHA-256 are those its
        ``metrics.json`` records; an unfinished cell's predictions must lie under a ``config.json`` that records its
        fingerprint. A fingerprint that differs from the run's is not a reason here but a conflict (`conflict`).
        """
        metrics = self.metrics()
        if self.metrics_path.exists() and metrics is None:
            return "its metrics.json is not readable"
        if metrics is not None and metrics.get("status") == "complete":
            if "fingerprint" not in metrics or "predictions_sha256" not in metrics:
                return "its metrics.json records no fingerprint or predictions digest (an older elastic-bench)"
            if not self.predictions_path.exists() or digest(self.predictions_path) != metrics["predictions_sha256"]:
                return "its predictions.jsonl is not the one its metrics.json was computed from"
            ids = [r.get("id") for r in read_jsonl(self.predictions_path)]
            if ids != metrics.get("prediction_ids") or len(set(ids)) != len(ids):
                return "its predictions' ids are not those its metrics.json records"
            return None
        if self.predictions() and "fingerprint" not in (self.config() or {}):
            return "it holds predictions without a readable config.json recording their configuration"
        return None

    def conflict(self, fingerprint: dict[str, Any]) -> list[str]:
        """The fingerprint fields in which the cell's recorded configuration differs from ``fingerprint`` ([]: none or
        nothing recorded)."""
        metrics = self.metrics() or {}
        stored = (metrics if metrics.get("status") == "complete" else self.config() or {}).get("fingerprint")
        if not isinstance(stored, dict):
            return []
        return sorted(k for k in fingerprint if k in stored and stored[k] != fingerprint[k])

    def clear(self) -> None:
        """Delete the cell's files (to compute it again)."""
        for path in [self.metrics_path, self.dir / "config.json", *self._prediction_files()]:
            path.unlink(missing_ok=True)

    def _prediction_files(self) -> list[Path]:
        return [self.predictions_path, *sorted(self.dir.glob("predictions.rank*.jsonl"))]

    def predictions(self) -> list[dict[str, Any]]:
        """Predictions written so far (rank shards included); a torn last line (an interrupted write) is dropped."""
        return [record for path in self._prediction_files() for record in read_jsonl(path)]

    def start(self, config: dict[str, Any]) -> None:
        """Write ``config.json`` and rewrite the predictions kept from an earlier interrupted attempt as one clean
        file."""
        self.merge()
        write_json(self.dir / "config.json", config)
        if self.metrics_path.exists():
            self.metrics_path.unlink()

    def append(self, record: dict[str, Any], rank: int | None = None) -> None:
        """Append one prediction (to this rank's shard under ``torchrun``)."""
        append_jsonl(self.predictions_path if rank is None else self.dir / f"predictions.rank{rank}.jsonl", record)

    def merge(self, order: list[str] | None = None) -> list[dict[str, Any]]:
        """Fold rank shards into ``predictions.jsonl`` (sorted by sample ``order`` when given); return the records."""
        records = self.predictions()
        if order is not None:
            position = {sample_id: i for i, sample_id in enumerate(order)}
            records.sort(key=lambda r: position.get(r["id"], len(position)))
        write_jsonl(self.predictions_path, records)
        for shard in self._prediction_files()[1:]:
            shard.unlink()
        return records

    def finish(self, metrics: dict[str, Any]) -> None:
        """Write ``metrics.json`` (atomically), with the count, ids and SHA-256 of ``predictions.jsonl``."""
        records = read_jsonl(self.predictions_path)
        written = {"num_predictions": len(records), "prediction_ids": [r["id"] for r in records],
                   "predictions_sha256": digest(self.predictions_path) if self.predictions_path.exists() else None}
        write_json(self.metrics_path, {**metrics, **written})


def finished(root: Path | str) -> list[Cell]:
    """The cells under ``root`` that hold a ``metrics.json`` (complete or failed; a cell still running holds none),
    sorted by model, method, task and length.

    Raises:
        ValueError: a ``metrics.json`` lies in a folder that is not a cell's (`Cell.at`).
    """
    cells = [Cell.at(root, path.parent) for path in Path(root).glob("*/*/*/*/metrics.json")]
    return sorted(cells, key=lambda c: (c.model, c.method, c.task, c.length))


def _json_object(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
