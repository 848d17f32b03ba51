"""The cells of a run folder: every ``<model>/<method>/<task>/<length>/metrics.json`` under it.

A complete cell is reported only if its ``predictions.jsonl`` is the one its ``metrics.json`` was computed from (the
SHA-256 it records); otherwise it is listed as failed, with the reason.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_bench.files import digest


@dataclass(frozen=True)
class CellResult:
    """One (model, method, task, length) cell as written by the runner.

    ``method`` is the result folder's name (a method and its options); ``score`` is the task's official score in
    percent; ``omega_msr`` / ``omega_esr`` are the cell means of the per-sample sparsity; ``prefill_seconds`` the
    median prefill time per sample (the mean for cells that record no median); ``device`` and ``backend`` say where
    and on which attention kernel the prefills ran. ``error`` is set for failed cells, whose numbers are NaN.
    """

    model: str
    method: str
    task: str
    length: int
    status: str
    score: float
    omega_msr: float
    omega_esr: float
    prefill_seconds: float
    num_samples: int
    error: str | None = None
    device: str = ""
    backend: str = ""

    @property
    def complete(self) -> bool:
        return self.status == "complete"


def _number(metrics: dict[str, Any], key: str) -> float:
    value = metrics.get(key)
    return float(value) if isinstance(value, (int, float)) and value is not None else math.nan


def _proves_itself(cell: Path, metrics: dict[str, Any]) -> bool:
    recorded = metrics.get("predictions_sha256")
    predictions = cell / "predictions.jsonl"
    return isinstance(recorded, str) and predictions.is_file() and digest(predictions) == recorded


def load_cells(run_dir: str | Path) -> list[CellResult]:
    """Every cell under ``run_dir`` (``metrics.json`` files at depth 4), sorted by model, method, task and length.

    Cells still running (a folder without ``metrics.json``) are not results yet and are left out.

    Raises:
        FileNotFoundError: ``run_dir`` does not exist.
        ValueError: a ``metrics.json`` is not the runner's JSON, or ``run_dir`` holds no cell at all.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no run folder at {root}")
    cells = []
    for path in sorted(root.glob("*/*/*/*/metrics.json")):
        model, method, task, length = path.relative_to(root).parts[:4]
        try:
            metrics = json.loads(path.read_text())
            if not isinstance(metrics, dict):
                raise TypeError(f"a JSON object was expected, got {type(metrics).__name__}")
            status, error = str(metrics["status"]), metrics.get("error")
            if status == "complete" and not _proves_itself(path.parent, metrics):
                status, error = "failed", ("its predictions.jsonl is not the one its metrics.json was computed from "
                                           "(rerun the run to compute the cell again)")
            cells.append(
                CellResult(
                    model=model, method=method, task=task, length=int(length),
                    status=status,
                    score=_number(metrics, "score"),
                    omega_msr=_number(metrics, "omega_msr"),
                    omega_esr=_number(metrics, "omega_esr"),
                    prefill_seconds=_number(metrics, "prefill_seconds_median" if "prefill_seconds_median" in metrics
                                            else "prefill_seconds"),
                    num_samples=int(metrics.get("num_samples") or 0),
                    error=error,
                    device=str(metrics.get("device") or ""),
                    backend=str(metrics.get("backend_used") or ""),
                )
            )
        except (KeyError, ValueError, TypeError) as err:  # JSON and UTF-8 decode errors are ValueErrors
            detail = f"no {err}" if isinstance(err, KeyError) else str(err)
            raise ValueError(f"{path} is not a cell's metrics.json written by `elastic-bench run` ({detail}); "
                             "rerun the cell or delete its folder") from None
    if not cells:
        raise ValueError(f"{root} holds no results (expected <model>/<method>/<task>/<length>/metrics.json)")
    return cells
