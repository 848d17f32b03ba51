"""The regression guard of the benchmarks: ``bench kernel|prefill|decode --baseline FILE`` holds a new result against
an earlier one (a result JSON these commands wrote, such as those shipped under ``docs/bench/``) and flags every cell
more than ``--tolerance`` slower on the same device.

Design decisions:
- A cell is a record of ``results`` with a time: ``ms`` (bench kernel), ``median_s`` (bench prefill) or
  ``median_ms`` (bench decode); it is known by the fields that name what it measures (`KEYS`: length, cell, backend,
  method, kv_cache, graphs — those the record has). A cell of one file that the other lacks is not compared, and the
  guard says how many there were.
- The same device: the two files' ``provenance.device`` (the GPU's name) must be equal; otherwise nothing is compared
  and the guard says why (a figure of another GPU is not a regression).
- A flagged cell gives both figures and their ratio; the command prints them, records them in its JSON
  (``regressions``) and exits with status 1 (its results are written all the same).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEYS = ("length", "cell", "backend", "method", "kv_cache", "graphs")
TIMES = ("ms", "median_s", "median_ms")  # the time of a record, by bench: kernel, prefill, decode


@dataclass
class RegressionConfig:
    """The regression guard of a benchmark command.

    Attributes:
        baseline: an earlier result JSON of the same command (e.g. under docs/bench/): every cell more than
            --tolerance slower than there, on the same device, is flagged and the command exits with status 1.
        tolerance: the slowdown a cell may show before it is flagged, as a fraction (0.05: 5%).
    """

    baseline: str | None = None
    tolerance: float = 0.05

    def __post_init__(self):
        if not 0 <= self.tolerance < 10:
            raise ValueError(f"tolerance must be a fraction in [0, 10), got {self.tolerance}")

    def load(self) -> dict[str, Any] | None:
        """The baseline's result, checked as one (None without --baseline).

        Raises:
            ValueError: the file cannot be read, is not JSON, or holds no ``results`` list of records.
        """
        if self.baseline is None:
            return None
        try:
            data = json.loads(Path(self.baseline).read_text())
        except OSError as err:
            raise ValueError(f"cannot read --baseline {self.baseline}: {err.strerror}") from None
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
            raise ValueError(f"--baseline {self.baseline} is not a result JSON ({type(err).__name__})") from None
        results = data.get("results") if isinstance(data, dict) else None
        if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
            raise ValueError(f"--baseline {self.baseline} holds no results list of a bench command")
        return data


@dataclass(frozen=True)
class Regression:
    """A cell (``key``: its naming fields) whose time ``now`` exceeds the baseline's ``before`` by more than the
    tolerance, in the unit ``unit`` of its bench."""

    key: dict[str, Any]
    unit: str
    before: float
    now: float

    @property
    def ratio(self) -> float:
        return self.now / self.before


def cells(report: dict[str, Any]) -> dict[tuple, tuple[str, float]]:
    """The timed records of a result: naming fields (as a sorted tuple of pairs) → (unit, time)."""
    found = {}
    for record in report.get("results", []):
        unit = next((t for t in TIMES if isinstance(record.get(t), (int, float))), None)
        if unit is not None:
            found[tuple((k, record[k]) for k in KEYS if k in record)] = (unit, float(record[unit]))
    return found


def compare(report: dict[str, Any], baseline: dict[str, Any], tolerance: float) -> tuple[list[Regression], str]:
    """The cells of ``report`` more than ``tolerance`` slower than in ``baseline``, and one sentence saying what was
    compared (or why nothing was)."""
    device, before_device = (r.get("provenance", {}).get("device") for r in (report, baseline))
    if device != before_device:
        return [], f"baseline ran on {before_device}, this run on {device}: not compared"
    now, before = cells(report), cells(baseline)
    shared = [k for k in now if k in before and before[k][0] == now[k][0] and before[k][1] > 0]
    flagged = [Regression(dict(k), now[k][0], before[k][1], now[k][1]) for k in shared
               if now[k][1] > (1 + tolerance) * before[k][1]]
    unmatched = len(now) - len(shared)
    return flagged, (f"{len(shared)} cells compared with the baseline on {device}, {len(flagged)} more than "
                     f"{tolerance:.0%} slower" + (f"; {unmatched} without a baseline cell" if unmatched else ""))


def format_regressions(flagged: list[Regression]) -> str:
    """A table of the flagged cells: their naming fields, the baseline's time, this run's and the ratio."""
    from tabulate import tabulate

    rows = [[" ".join(f"{k}={v}" for k, v in r.key.items()), f"{r.before:.4g} {r.unit}", f"{r.now:.4g} {r.unit}",
             f"{r.ratio:.3f}x"] for r in flagged]
    return tabulate(rows, headers=["cell", "baseline", "now", "slower by"], disable_numparse=True)
