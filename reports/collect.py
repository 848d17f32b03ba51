"""The cells of a run folder: every ``<model>/<method>/<task>/<length>/metrics.json`` under it."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CellResult:
    """One (model, method, task, length) cell as written by the runner.

    ``method`` is the result folder's name (a method and its options); ``score`` is the task's official score in
    percent; ``omega_msr`` / ``omega_esr`` are the cell means of the per-sample sparsity; ``prefill_seconds`` the mean
    prefill time per sample. ``error`` is set for failed cells, whose numbers are NaN.
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

    @property
    def complete(self) -> bool:
        return self.status == "complete"


def _number(metrics: dict[str, Any], key: str) -> float:
    value = metrics.get(key)
    return float(value) if isinstance(value, (int, float)) and value is not None else math.nan


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
            cells.append(
                CellResult(
                    model=model, method=method, task=task, length=int(length),
                    status=str(metrics["status"]),
                    score=_number(metrics, "score"),
                    omega_msr=_number(metrics, "omega_msr"),
                    omega_esr=_number(metrics, "omega_esr"),
                    prefill_seconds=_number(metrics, "prefill_seconds"),
                    num_samples=int(metrics.get("num_samples") or 0),
                    error=metrics.get("error"),
                )
            )
        except (json.JSONDecodeError, KeyError, ValueError, TypeError) as err:
            raise ValueError(f"{path} is not a cell's metrics.json written by `elastic-bench run` ({err})") from None
    if not cells:
        raise ValueError(f"{root} holds no results (expected <model>/<method>/<task>/<length>/metrics.json)")
    return cells
