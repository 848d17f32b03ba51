"""The results store: one folder per cell, ``<root>/<model>/<method>/<task>/<length>/``.

Files: ``config.json`` (what ran), ``predictions.jsonl`` (one line per sample, appended and flushed as it is
scored, so an interrupted cell resumes where it stopped; under ``torchrun`` each rank appends to
``predictions.rank<r>.jsonl`` and rank 0 merges them), ``metrics.json`` (written atomically last; its ``status`` is
``"complete"`` or ``"failed"``). A complete cell is skipped on re-run; a failed one is retried.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from elastic_bench.files import append_jsonl, read_jsonl, write_json, write_jsonl


class Cell:
    """The files of one (model, method, task, length) cell."""

    def __init__(self, root: Path | str, model: str, method: str, task: str, length: int):
        self.model, self.method, self.task, self.length = model, method, task, length
        self.dir = Path(root) / model / method / task / str(length)

    @property
    def metrics_path(self) -> Path:
        return self.dir / "metrics.json"

    @property
    def predictions_path(self) -> Path:
        return self.dir / "predictions.jsonl"

    def metrics(self) -> dict[str, Any] | None:
        if not self.metrics_path.exists():
            return None
        return json.loads(self.metrics_path.read_text())

    def is_complete(self) -> bool:
        metrics = self.metrics()
        return metrics is not None and metrics.get("status") == "complete"

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
        write_json(self.metrics_path, metrics)
