"""The results store: one folder per cell, ``<root>/<model>/<method>/<task>/<length>/``.

Files: ``config.json`` (what ran), ``predictions.jsonl`` (one line per sample, appended and flushed as it is
scored, so an interrupted cell resumes where it stopped; under ``torchrun`` each rank appends to
``predictions.rank<r>.jsonl`` and rank 0 merges them), ``metrics.json`` (written atomically last; its ``status`` is
``"complete"`` or ``"failed"``). A complete cell is skipped on re-run; a failed one is retried.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temporary file in the same folder, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, default=str)
        f.write("\n")
    os.replace(tmp, path)


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
        records = []
        for path in self._prediction_files():
            if not path.exists():
                continue
            for line in path.read_text().splitlines():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    break
        return records

    def start(self, config: dict[str, Any]) -> None:
        """Write ``config.json`` and rewrite the predictions kept from an earlier interrupted attempt as one clean
        file."""
        self.merge()
        write_json(self.dir / "config.json", config)
        if self.metrics_path.exists():
            self.metrics_path.unlink()

    def append(self, record: dict[str, Any], rank: int | None = None) -> None:
        """Append one prediction (to this rank's shard under ``torchrun``)."""
        path = self.predictions_path if rank is None else self.dir / f"predictions.rank{rank}.jsonl"
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def merge(self, order: list[str] | None = None) -> list[dict[str, Any]]:
        """Fold rank shards into ``predictions.jsonl`` (sorted by sample ``order`` when given); return the records."""
        records = self.predictions()
        if order is not None:
            position = {sample_id: i for i, sample_id in enumerate(order)}
            records.sort(key=lambda r: position.get(r["id"], len(position)))
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.predictions_path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
        os.replace(tmp, self.predictions_path)
        for shard in self._prediction_files()[1:]:
            shard.unlink()
        return records

    def finish(self, metrics: dict[str, Any]) -> None:
        write_json(self.metrics_path, metrics)
