"""The results store: one folder per cell, ``<root>/<model>/<method>/<task>/<length>/``.

Files: ``config.json`` (what ran), ``predictions.jsonl`` (one line per sample, appended and flushed as it is
scored, so an interrupted cell resumes where it stopped), ``metrics.json`` (written atomically last; its ``status``
is ``"complete"`` or ``"failed"``). A complete cell is skipped on re-run; a failed one is retried.
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

    def predictions(self) -> list[dict[str, Any]]:
        """Predictions written so far; a torn last line (from an interrupted write) is dropped."""
        if not self.predictions_path.exists():
            return []
        records = []
        for line in self.predictions_path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
        return records

    def start(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        """Write ``config.json``; return the predictions kept from an earlier interrupted attempt (rewritten clean)."""
        kept = self.predictions()
        write_json(self.dir / "config.json", config)
        with open(self.predictions_path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)
        if self.metrics_path.exists():
            self.metrics_path.unlink()
        return kept

    def append(self, record: dict[str, Any]) -> None:
        with open(self.predictions_path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def finish(self, metrics: dict[str, Any]) -> None:
        write_json(self.metrics_path, metrics)
