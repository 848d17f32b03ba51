"""The cells of a run folder: every ``<model>/<method>/<task>/<length>/metrics.json`` under it.

Design decisions:
- A complete cell is reported only if its ``predictions.jsonl`` is the one its ``metrics.json`` was computed from (the
  SHA-256 it records); otherwise it is listed as failed, with the reason.
- Per-sample records (`SampleResult`) are read on first use: tables need only the cell means, the paired bootstrap
  and the routing maps need the samples.
- The task's official breakdowns (``score_<name>`` keys of ``metrics.json``: LongBench-E's length buckets,
  LongBench-v2's difficulty and length) are kept as written, rounded as the official scripts round them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from elastic_bench.foundation.files import digest, read_jsonl


@dataclass(frozen=True)
class SampleResult:
    """One scored sample of a cell (a line of ``predictions.jsonl``).

    ``score`` is in percent (the task's per-sample score × 100); ``category`` the sample's ``metadata.category``
    (the testbed's ``sensitive`` / ``robust``) or None; ``decisions`` the prefill mode of every KV head,
    ``[layers][kv_heads]`` ints (0 FULL, 1 STREAMING, 2 BLOCK_SPARSE), or None when the method records none.
    """

    id: str
    score: float
    omega_msr: float
    omega_esr: float
    category: str | None = None
    decisions: tuple[tuple[int, ...], ...] | None = None


@dataclass(frozen=True)
class CellResult:
    """One (model, method, task, length) cell as written by the runner.

    ``method`` is the result folder's name (a method and its changed options); ``method_name`` the registered
    method and ``options`` all its options; ``score`` is the task's official score in percent and ``breakdown`` its
    official sub-scores (``{"0-4k": 41.2, ...}``, percent); ``omega_msr`` / ``omega_esr`` are the cell means of the
    per-sample sparsity; ``prefill_seconds`` the median prefill time per sample (the mean for cells that record no
    median); ``device`` and ``backend`` say where and on which attention kernel the prefills ran; ``versions``,
    ``git_hash`` and ``date`` where the cell was computed. ``error`` is set for failed cells, whose numbers are NaN.
    ``run`` names the run folder among several (`elastic-bench compare`), ``path`` is the cell's folder.
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
    method_name: str = ""
    options: dict[str, Any] = field(default_factory=dict, compare=False)
    breakdown: dict[str, float] = field(default_factory=dict, compare=False)
    versions: dict[str, str] = field(default_factory=dict, compare=False)
    git_hash: str = ""
    date: str = ""
    run: str = ""
    path: Path | None = None

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    @cached_property
    def samples(self) -> list[SampleResult]:
        """The cell's scored samples (read from ``predictions.jsonl`` once; [] for a failed cell)."""
        if not self.complete or self.path is None:
            return []
        return [_sample(record) for record in read_jsonl(self.path / "predictions.jsonl")]


def _sample(record: dict[str, Any]) -> SampleResult:
    decisions = record.get("decisions")
    metadata = record.get("metadata") or {}
    return SampleResult(
        id=str(record["id"]),
        score=100 * float(record["score"]),
        omega_msr=_number(record, "omega_msr"),
        omega_esr=_number(record, "omega_esr"),
        category=metadata.get("category") if isinstance(metadata.get("category"), str) else None,
        decisions=tuple(tuple(int(m) for m in row) for row in decisions) if decisions else None,
    )


def _number(metrics: dict[str, Any], key: str) -> float:
    value = metrics.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _proves_itself(cell: Path, metrics: dict[str, Any]) -> bool:
    recorded = metrics.get("predictions_sha256")
    predictions = cell / "predictions.jsonl"
    return isinstance(recorded, str) and predictions.is_file() and digest(predictions) == recorded


def _cell(root: Path, path: Path, run: str) -> CellResult:
    model, method, task, length = path.relative_to(root).parts[:4]
    metrics = json.loads(path.read_text())
    if not isinstance(metrics, dict):
        raise TypeError(f"a JSON object was expected, got {type(metrics).__name__}")
    status, error = str(metrics["status"]), metrics.get("error")
    if status == "complete" and not _proves_itself(path.parent, metrics):
        status, error = "failed", ("its predictions.jsonl is not the one its metrics.json was computed from "
                                   "(rerun the run to compute the cell again)")
    return CellResult(
        model=model, method=method, task=task, length=int(length),
        status=status,
        score=_number(metrics, "score"),
        omega_msr=_number(metrics, "omega_msr"),
        omega_esr=_number(metrics, "omega_esr"),
        prefill_seconds=_number(metrics, "prefill_seconds_median" if "prefill_seconds_median" in metrics
                                else "prefill_seconds"),
        num_samples=int(metrics.get("num_samples") or 0),
        error=str(error) if error is not None else None,
        device=str(metrics.get("device") or ""),
        backend=str(metrics.get("backend_used") or ""),
        method_name=str(metrics.get("method") or method.split("-")[0]),
        options=dict(metrics.get("method_options") or {}),
        breakdown={k.removeprefix("score_"): _number(metrics, k) for k in metrics if k.startswith("score_")},
        versions={str(k): str(v) for k, v in (metrics.get("versions") or {}).items()},
        git_hash=str(metrics.get("git_hash") or ""),
        date=str(metrics.get("date") or ""),
        run=run,
        path=path.parent,
    )


def load_cells(run_dir: str | Path, run: str = "") -> list[CellResult]:
    """Every cell under ``run_dir`` (``metrics.json`` files at depth 4), sorted by model, method, task and length.

    Cells still running (a folder without ``metrics.json``) are not results yet and are left out. ``run`` names the
    run in a comparison of several (`CellResult.run`).

    Raises:
        FileNotFoundError: ``run_dir`` does not exist.
        ValueError: a ``metrics.json`` is not the runner's JSON, or ``run_dir`` holds no cell at all.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no run folder at {root}")
    cells = []
    for path in sorted(root.glob("*/*/*/*/metrics.json")):
        try:
            cells.append(_cell(root, path, run))
        except (KeyError, ValueError, TypeError) as err:  # JSON and UTF-8 decode errors are ValueErrors
            detail = f"no {err}" if isinstance(err, KeyError) else str(err)
            raise ValueError(f"{path} is not a cell's metrics.json written by `elastic-bench run` ({detail}); "
                             "rerun the cell or delete its folder") from None
    if not cells:
        raise ValueError(f"{root} holds no results (expected <model>/<method>/<task>/<length>/metrics.json)")
    return cells
