"""The cells of a run folder, read through the results store (`elastic_bench.results.store`: its folder layout, its
files, its proof check).

Design decisions:
- A complete cell is reported only if it proves itself as the runner requires before it skips a cell
  (`elastic_bench.results.store.Cell.verify`: its predictions are those its ``metrics.json`` was computed from, and,
  given its task's scoring, every prediction's score is the one its prediction and references give and the scores it
  records are those its predictions give); otherwise it is listed as failed, with the reason. The scorings are the
  tasks' (`elastic_bench.tasks`), which this pillar does not import: the caller passes them (`Scorings`).
- Per-sample records (`SampleResult`) are read on first use: tables need only the cell means, the paired bootstrap
  and the routing maps need the samples.
- The task's official breakdowns (``score_<name>`` keys of ``metrics.json``: LongBench-E's length buckets,
  LongBench-v2's difficulty and length) are kept as written, rounded as the official scripts round them.
- What the method's learned files were trained on is read as the runner records it (``metrics.json``):
  ``artifact_provenance`` (per option, the file's provenance, or None where the file records none),
  ``in_distribution`` (the learned files that share an identity, a generator or a dataset, with the cell's task) and
  ``allow_in_distribution`` (whether the run was told to score such cells). A cell written before they were recorded
  reads as no provenance known and no in-distribution finding.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from elastic_bench.results.store import Cell, Scoring, finished

Scorings = Callable[[str], Scoring | None]
"""A task name → that task's official scoring of its prediction records (the task: its ``rescore`` and ``aggregate``),
or None for a task it does not know."""


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

    ``method`` is the result folder's name (a method and its changed options); ``method_name`` the registered method
    and ``options`` all its options; ``preset`` the settings preset that set them (None: none applied); ``score`` is
    the task's official score in percent and ``breakdown`` its official sub-scores (``{"0-4k": 41.2, ...}``,
    percent); ``omega_msr`` / ``omega_esr`` are the cell means of the per-sample sparsity; ``prefill_seconds`` the
    median prefill time per sample of the prompts timed alone (batch 1; the mean for cells that record no median);
    ``samples_per_second`` the generation throughput of the prompts run batched, at ``batch_size`` (NaN for a cell
    run at batch 1): a throughput, never a prefill time; ``ceiling`` the mean over its prompts of the prefill speedup
    the model's FLOPs allow the method's plans (NaN for cells that record none; `elastic_bench.modeling.cost`);
    ``device`` and ``backend`` say where and on which attention
    kernel the prefills ran; ``artifacts`` the learned files the method loaded, by option name, as SHA-256 digests
    (``{"router": "818e…"}``) and ``artifact_provenance`` what they were trained on, by option name (None: unknown),
    and ``learned_files`` their names (``{"router": "testbed/elastic_router"}``: a file the model ships under the
    model's name, any other by its last path component; {} for a cell that records none); ``in_distribution`` the
    learned files trained on the task's generator or dataset (``{"artifact": "router", "shared":
    ["generator:ruler.niah"]}``; empty when the cell is held out) and ``allow_in_distribution`` whether the run was
    told to score it anyway; ``versions``, ``git_hash``, ``source_digest`` and ``date`` where and from which code the
    cell was computed. ``error`` is set for failed cells, whose numbers are NaN. ``run`` names the run folder
    among several (`elastic-bench compare`), ``cell`` is the cell in the results store.
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
    samples_per_second: float = math.nan
    batch_size: int = 1
    ceiling: float = math.nan
    error: str | None = None
    device: str = ""
    backend: str = ""
    method_name: str = ""
    options: dict[str, Any] = field(default_factory=dict, compare=False)
    preset: str | None = None
    artifacts: dict[str, str] = field(default_factory=dict, compare=False)
    learned_files: dict[str, str] = field(default_factory=dict, compare=False)
    breakdown: dict[str, float] = field(default_factory=dict, compare=False)
    artifact_provenance: dict[str, dict[str, Any] | None] = field(default_factory=dict, compare=False)
    in_distribution: tuple[dict[str, Any], ...] = ()
    allow_in_distribution: bool = False
    versions: dict[str, str] = field(default_factory=dict, compare=False)
    git_hash: str = ""
    source_digest: str = ""
    date: str = ""
    run: str = ""
    cell: Cell | None = field(default=None, compare=False)

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    @cached_property
    def samples(self) -> list[SampleResult]:
        """The cell's scored samples (read from ``predictions.jsonl`` once; [] for a failed cell)."""
        if not self.complete or self.cell is None:
            return []
        return [_sample(record) for record in self.cell.predictions()]


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


def _finding(found: dict[str, Any]) -> dict[str, Any]:
    """One ``in_distribution`` entry as the runner writes it: the learned file's option name and the identities it
    shares with the task."""
    return {"artifact": str(found["artifact"]), "shared": tuple(str(s) for s in found.get("shared") or ())}


def _number(metrics: dict[str, Any], key: str) -> float:
    value = metrics.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _result(cell: Cell, run: str, scorings: Scorings | None) -> CellResult:
    metrics = cell.metrics()
    if metrics is None:
        raise ValueError("not a JSON object")
    status, error = str(metrics["status"]), metrics.get("error")
    scoring = scorings(cell.task) if scorings is not None and status == "complete" else None
    if status == "complete" and (reason := cell.verify(scoring)) is not None:
        status, error = "failed", f"{reason} (rerun the run to compute the cell again)"
    fingerprint = metrics.get("fingerprint") if isinstance(metrics.get("fingerprint"), dict) else {}
    return CellResult(
        model=cell.model, method=cell.method, task=cell.task, length=cell.length,
        status=status,
        score=_number(metrics, "score"),
        omega_msr=_number(metrics, "omega_msr"),
        omega_esr=_number(metrics, "omega_esr"),
        prefill_seconds=_number(metrics, "prefill_seconds_median" if "prefill_seconds_median" in metrics
                                else "prefill_seconds"),
        num_samples=int(metrics.get("num_samples") or 0),
        samples_per_second=_number(metrics, "samples_per_second"),
        batch_size=int(metrics.get("batch_size_used") or 1),
        ceiling=_number(metrics, "ceiling"),
        error=str(error) if error is not None else None,
        device=str(metrics.get("device") or ""),
        backend=str(metrics.get("backend_used") or ""),
        method_name=str(metrics.get("method") or cell.method.split("-")[0]),
        options=dict(metrics.get("method_options") or {}),
        preset=str(metrics["preset"]) if metrics.get("preset") else None,
        artifacts={str(k): str(v) for k, v in (fingerprint.get("artifacts") or {}).items()},
        learned_files={str(k): str(v) for k, v in (metrics.get("learned_files") or {}).items()},
        breakdown={k.removeprefix("score_"): _number(metrics, k) for k in metrics if k.startswith("score_")},
        artifact_provenance={str(k): v if isinstance(v, dict) else None
                             for k, v in (metrics.get("artifact_provenance") or {}).items()},
        in_distribution=tuple(_finding(f) for f in metrics.get("in_distribution") or ()),
        allow_in_distribution=metrics.get("allow_in_distribution") is True,
        versions={str(k): str(v) for k, v in (metrics.get("versions") or {}).items()},
        git_hash=str(metrics.get("git_hash") or ""),
        source_digest=str(metrics.get("source_digest") or ""),
        date=str(metrics.get("date") or ""),
        run=run,
        cell=cell,
    )


def load_cells(run_dir: str | Path, run: str = "", scorings: Scorings | None = None) -> list[CellResult]:
    """Every finished cell under ``run_dir`` (`elastic_bench.results.store.finished`), sorted by model, method, task
    and length.

    Cells still running (a folder without ``metrics.json``) are not results yet and are left out. ``run`` names the
    run in a comparison of several (`CellResult.run`). With ``scorings``, every prediction's score of a complete cell
    is computed again from its prediction and references, and the cell's scores from those with its task's official
    aggregation: a cell whose files record others (an edited score, an edited prediction, a score outside the task's
    range) is reported as failed; without, its predictions are checked, not its scores.

    Raises:
        FileNotFoundError: ``run_dir`` does not exist.
        ValueError: a ``metrics.json`` is not the runner's JSON or lies outside a cell's folder, or ``run_dir`` holds no
            cell at all.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no run folder at {root}")
    cells = []
    for cell in finished(root):
        try:
            cells.append(_result(cell, run, scorings))
        except (KeyError, ValueError, TypeError) as err:
            detail = f"no {err}" if isinstance(err, KeyError) else str(err)
            raise ValueError(f"{cell.metrics_path} is not a cell's metrics.json written by `elastic-bench run` "
                             f"({detail}); rerun the cell or delete its folder") from None
    if not cells:
        raise ValueError(f"{root} holds no results (expected <model>/<method>/<task>/<length>/metrics.json)")
    return cells
