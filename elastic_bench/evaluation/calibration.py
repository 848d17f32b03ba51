"""Budgets: every method with a sparsity knob calibrated to a requested ΩESR (or ΩMSR) on a calibration split of the
prompts, then evaluated at that knob on the held-out prompts (`elastic-bench calibrate`).

Design decisions:
- A budget is a configuration of every method of the run: ``streaming-esr=0.5`` is streaming with its window set,
  per length, so that its mean ΩESR on the calibration prompts lies within the tolerance of 0.5. ``full`` runs once,
  on the same held-out prompts: the reference of every budget. A method declares its knobs (`Method.knobs`,
  `elastic_bench.modeling.interface.SparsityKnob`); a method without one is reported as such (its cells fail with that
  reason), never given a value.
- The split, per task and length: the task's first ``calibration_samples`` samples calibrate, the next ``--limit`` are
  evaluated. The knobs of a length are calibrated on the calibration samples of every task of the run at that length
  pooled (a budget holds over the run's tasks, as a deployment sets one knob per length): an adaptive method keeps its
  freedom to spend the budget unevenly across tasks.
- Calibration needs no generation: a plan's ΩESR is counted in the prefill (`measured`: one forward per prompt,
  ``use_cache=False``, the plans counted by the same code as a run's).
- The search is monotone (`search`): the measure rises with the knob's sparser direction. From the knob's default it
  brackets the target (a bounded end in one step, an unbounded one by doubling), then alternates interpolation and
  bisection inside the bracket until a value lies within a quarter of the tolerance (room for the held-out prompts),
  the bracket closes (whole numbers: adjacent values) or `MAX_EVALUATIONS` are spent. A second knob refines where the
  first moves in steps coarser than the tolerance (DuoAttention's and PruLong's share of streaming heads: one head of
  a model's L·H is a step): the first is held at its value just past the target and the second searched from its
  default on the side that brings the measure back (their window widened), or, where the first cannot reach the
  target, on the sparser side.
- Outcome per (configuration, length): the knob values, the measure they reach on the calibration prompts, every
  value tried; or why no value meets the budget (a target outside what the knob spans, or a knob whose steps straddle
  the target), and the cell fails with that reason. Every cell of a budget run records the split (which sample ids
  calibrated) and its own held-out measure (``omega_esr``, ``omega_msr``); the report checks the held-out means
  against the tolerance.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from elastic_bench.foundation.options import check_at_least

if TYPE_CHECKING:
    from elastic_bench.modeling.interface import Method, SparsityKnob

Measure = Literal["omega_esr", "omega_msr"]
TAGS = {"omega_esr": "esr", "omega_msr": "msr"}  # a budget's tag in its configurations' folder names
MAX_EVALUATIONS = 24  # knob values tried per knob
MAX_DOUBLINGS = 16  # steps outward along an unbounded knob before its end counts as unreachable
MAX_STALE = 4  # steps of a search that find a measure already seen before it stops (a measure that moves in steps)
REFERENCE = "full"  # the method a budget run evaluates once, unbudgeted


@dataclass
class BudgetConfig:
    """The budgets of ``elastic-bench calibrate``.

    Attributes:
        budgets: comma-separated targets of the measure (e.g. 0.3,0.5,0.7,0.9): each is a configuration of every
            method of the run with a sparsity knob (full runs once, as the reference of every budget).
        measure: what a budget holds: omega_esr (the share of causal query-key pairs skipped) or omega_msr (the share
            of KV heads not attending in full).
        tolerance: how far the mean measure on the calibration prompts may lie from a budget (absolute); the report
            checks the held-out prompts against it too.
        calibration_samples: per task and length, the first N samples calibrate the knobs (every task's pooled at a
            length) and the next --limit samples are evaluated.
    """

    budgets: list[float] = field(default_factory=lambda: [0.3, 0.5, 0.7, 0.9])
    measure: Measure = "omega_esr"
    tolerance: float = 0.02
    calibration_samples: int = 4

    def __post_init__(self):
        if not self.budgets:
            raise ValueError("--budgets is empty; give targets in [0, 1], e.g. 0.3,0.5,0.7,0.9")
        bad = [b for b in self.budgets if not 0.0 <= b <= 1.0]
        if bad:
            raise ValueError(f"--budgets must lie in [0, 1], got {', '.join(map(str, bad))}")
        if len(set(self.budgets)) < len(self.budgets):
            raise ValueError(f"--budgets holds a target twice: {','.join(map(str, self.budgets))}")
        if self.measure not in TAGS:
            raise ValueError(f"--measure must be one of {', '.join(TAGS)}, got {self.measure!r}")
        if not 0.0 < self.tolerance < 1.0:
            raise ValueError(f"--tolerance must lie in (0, 1), got {self.tolerance}")
        check_at_least("--calibration-samples", self.calibration_samples, 1)

    def targets(self) -> list[Budget]:
        return [Budget(self.measure, target, self.tolerance) for target in self.budgets]


@dataclass(frozen=True)
class Budget:
    """One budget: the ``measure`` a configuration holds to ``target`` within ``tolerance``."""

    measure: Measure
    target: float
    tolerance: float

    @property
    def tag(self) -> str:
        """Its mark in a folder name, ``esr=0.5``."""
        return f"{TAGS[self.measure]}={self.target:g}"

    def record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def met(self, value: float) -> bool:
        return abs(value - self.target) <= self.tolerance


@dataclass
class Calibration:
    """What calibrating one method to one budget at one length found.

    Attributes:
        budget: the budget.
        options: the knob values chosen (the best tried; ``{"local": 300}``).
        achieved: the mean measure on the calibration prompts at those values.
        tried: every knob setting tried with its measure, in order.
        error: why no setting meets the budget (None: one does).
    """

    budget: Budget
    options: dict[str, float] = field(default_factory=dict)
    achieved: float = math.nan
    tried: list[tuple[dict[str, float], float]] = field(default_factory=list)
    error: str | None = None

    def record(self, calibration_ids: dict[str, list[str]]) -> dict[str, Any]:
        """What a cell records of it (``calibration`` in config.json and metrics.json), with the split."""
        return {**self.budget.record(), "knobs": self.options, "achieved": self.achieved,
                "within_tolerance": self.error is None, "evaluations": len(self.tried),
                "tried": [{"knobs": knobs, "measured": value} for knobs, value in self.tried],
                "calibration_ids": calibration_ids, **({"error": self.error} if self.error else {})}


def split_record(calibration_ids: dict[str, list[str]]) -> dict[str, Any]:
    """What the reference's cells of a budget run record (``calibration``): the samples the run calibrated on."""
    return {"calibration_ids": calibration_ids}


def entries(method: Method, given: dict[str, Any], label: Callable[[Method, Budget | None], str],
            config: BudgetConfig | None) -> list[tuple[str, Budget | None]]:
    """The configurations of ``method`` in a run, ``(folder label, budget)``: without budgets, or for the reference,
    one unbudgeted; else one per budget (``label(method, budget)``, `label`).

    Raises:
        ValueError: the options ``given`` for the method (``-O``) set the knob the calibration sets (its first; a
            preset's value of it is replaced).
    """
    if config is None or method.name == REFERENCE:
        return [(label(method, None), None)]
    if method.knobs and method.knobs[0].option in given:
        raise ValueError(f"{method.name}.{method.knobs[0].option} is the knob calibrate sets for each budget; leave "
                         "it out")
    return [(label(method, budget), budget) for budget in config.targets()]


def label(method: Method, budget: Budget, base: dict[str, Any], tag: str | None) -> str:
    """The result folder of ``method`` at ``budget``: `Method.label` with the budget's tag first (then ``tag``, a
    preset's, with its options ``base``), the knob the calibration sets left out: ``streaming-esr=0.5-sink=16``."""
    knob = {k.option: getattr(method, k.option) for k in method.knobs[:1]}
    return method.label(base={**base, **knob}, tag="-".join([budget.tag, *([tag] if tag else [])]))


def fingerprint(base: dict[str, Any], method: Method, budget: Budget | None, calibration_samples: int
                ) -> dict[str, Any]:
    """The fingerprint of a budget run's cell: the run's (``base``, `elastic_bench.evaluation.runner._fingerprint`)
    with the split and the budget, and without the option the calibration sets."""
    options = dict(base["method_options"])
    if budget is not None and method.knobs:
        options.pop(method.knobs[0].option, None)
    return {**base, "method_options": options, "split": {"calibration_samples": calibration_samples},
            **({"budget": budget.record()} if budget is not None else {})}


def measured(model, method: Method, prompts: list[list[int]], measure: Measure, backend: str = "auto") -> float:
    """The mean ``measure`` (ΩESR or ΩMSR) of ``method``'s plans over ``prompts`` (token ids), each prefilled alone (one
    forward, no cache: the plans, not the generation)."""
    import torch

    from elastic_bench.modeling.attention import apply

    device = next(model.parameters()).device
    with torch.inference_mode(), apply(method, model, backend=backend) as handle:
        for ids in prompts:
            model(input_ids=torch.tensor([ids], device=device), logits_to_keep=1, use_cache=False)
        per_sample = handle.stats()["per_sample"]
    return sum(s[measure] for s in per_sample) / len(per_sample)


def search(measure: Callable[[float], float], knob: SparsityKnob, target: float, tolerance: float, start: float,
           low: float | None = None, high: float | None = None) -> list[tuple[float, float]]:
    """Every value of ``knob`` tried, with its measure, in order, searching one that meets ``target`` within
    ``tolerance`` (module doc): ``measure(value)`` rises toward the knob's sparser side; values lie in ``[low,
    high]`` (the knob's range by default), the search starts at ``start``.

    A measure that moves in steps (a router's or a selection's decisions flip at some values only) ends the search
    once bisection keeps landing on a step's measure (`MAX_STALE` times; half as many where a value already meets
    the budget); the last value tried is then the middle of the step that meets the budget best, found between the
    values of other measures around it: the value farthest from the step's edges, where held-out prompts flip the
    fewest decisions."""
    low = knob.low if low is None else low
    high = knob.high if high is None else high
    seen: dict[float, float] = {}

    def f(value: float) -> float:
        value = _rounded(value, knob)
        if value not in seen:
            seen[value] = measure(value)
        return seen[value]

    start = _rounded(min(max(start, low), high), knob)
    a, b = _bracket(f, knob, target, start, low, high)  # a: measure <= target (denser), b: measure >= target
    interpolate, stale = True, 0
    while a is not None and b is not None and len(seen) < MAX_EVALUATIONS:
        best = min(abs(m - target) for m in seen.values())
        patience = MAX_STALE // 2 if best <= tolerance else MAX_STALE
        if best <= tolerance / 4 or _closed(a, b, knob) or stale >= patience:
            break
        x = (a + b) / 2
        if interpolate and f(b) > f(a):
            share = min(max((target - f(a)) / (f(b) - f(a)), 0.05), 0.95)
            x = a + share * (b - a)
        x = _rounded(x, knob)
        if x in (a, b):
            x = _rounded((a + b) / 2, knob)
        if x in (a, b):
            break
        stale = stale + 1 if f(x) in (f(a), f(b)) else 0
        if f(x) >= target:
            b = x
        else:
            a = x
        interpolate = not interpolate
    _step_middle(f, seen, knob, target)
    return list(seen.items())


def _bracket(f: Callable[[float], float], knob: SparsityKnob, target: float, start: float, low: float, high: float
             ) -> tuple[float | None, float | None]:
    """Values ``(a, b)`` around the target, ``f(a) <= target <= f(b)``, from ``start`` outward (a bounded end at once,
    an unbounded one by doubling steps, given up after `MAX_DOUBLINGS`, or once the measure, having moved, stays the
    same for `MAX_STALE` steps); None for the side that does not reach the target."""
    sparser = 1.0 if knob.sparser == "higher" else -1.0
    if f(start) == target:
        return start, start
    outward = f(start) < target  # then look toward the sparser end for b, else toward the denser end for a
    end = (high if sparser > 0 else low) if outward else (low if sparser > 0 else high)
    near, value, step, same, moved = start, start, max(1.0, abs(start)), 0, False
    for _ in range(MAX_DOUBLINGS):
        value = _rounded(end if math.isfinite(end) else value + math.copysign(step, end - value), knob)
        step *= 2
        if (f(value) >= target) if outward else (f(value) <= target):
            return (near, value) if outward else (value, near)
        moved = moved or f(value) != f(start)
        same = same + 1 if moved and f(value) == f(near) else 0
        if value == end or same >= MAX_STALE:
            break
        near = value
    return (near, None) if outward else (None, near)


def _step_middle(f: Callable[[float], float], seen: dict[float, float], knob: SparsityKnob, target: float) -> None:
    """Try the middle of the step whose measure meets ``target`` best, where two or more values of ``seen`` share
    that measure: halfway between the nearest values of other measures on either side."""
    best = min(seen.values(), key=lambda m: abs(m - target))
    flat = [v for v, m in seen.items() if m == best]
    if len(flat) < 2:
        return
    below = [v for v, m in seen.items() if m != best and v < min(flat)]
    above = [v for v, m in seen.items() if m != best and v > max(flat)]
    if below and above:
        middle = _rounded((max(below) + min(above)) / 2, knob)
        if middle not in seen:
            f(middle)


def _rounded(value: float, knob: SparsityKnob) -> float:
    return int(round(value)) if knob.integer else float(value)


def _closed(a: float, b: float, knob: SparsityKnob) -> bool:
    """Whether no value of the knob lies strictly between ``a`` and ``b`` worth trying."""
    return abs(b - a) <= 1 if knob.integer else abs(b - a) <= 1e-6 * max(1.0, abs(a), abs(b))


def calibrate(model, method: Method, budget: Budget, prompts: list[list[int]], backend: str = "auto",
              progress: Callable[[float], None] | None = None) -> Calibration:
    """Calibrate ``method``'s knobs (`Method.knobs`) to ``budget`` on ``prompts`` (token ids of the calibration
    split): the first knob, then the second where the first's steps straddle the target (module doc). ``progress``
    is called with each measure found."""
    found = Calibration(budget)
    if not method.knobs:
        found.error = f"{method.name} has no sparsity knob: it cannot be calibrated to a budget"
        return found
    fixed: dict[str, float] = {}  # the first knob's value while the second is searched
    known: dict[float, float] = {}  # the second knob's measures already taken (at its default, by the first search)

    def measure_at(knob: SparsityKnob) -> Callable[[float], float]:
        def at(value: float) -> float:
            if fixed and value in known:
                return known[value]
            options = {**fixed, knob.option: value}
            result = measured(model, dataclasses.replace(method, **options), prompts, budget.measure, backend)
            found.tried.append((options, result))
            if progress is not None:
                progress(result)
            return result

        return at

    first = method.knobs[0]
    values = search(measure_at(first), first, budget.target, budget.tolerance, getattr(method, first.option))
    _choose(found)
    if found.error is None or len(method.knobs) == 1:
        return found
    # the first knob's steps straddle the target, or it cannot reach it: hold it at the value past the target (its
    # sparsest where none is) and refine with the second on the side that comes back to the target
    over = [(v, m) for v, m in values if m >= budget.target]
    sign = 1.0 if first.sparser == "higher" else -1.0
    held, reached = min(over, key=lambda p: sign * p[0]) if over else max(values, key=lambda p: sign * p[0])
    second = method.knobs[1]
    start = getattr(method, second.option)
    denser_high = second.sparser == "lower"  # the second knob's denser values are its higher ones
    back_to_target = reached >= budget.target  # then the second knob moves toward denser
    bounds = (start, None) if denser_high == back_to_target else (None, start)
    fixed[first.option] = held
    known[start] = reached
    search(measure_at(second), second, budget.target, budget.tolerance, start, *bounds)
    _choose(found)
    return found


def _choose(found: Calibration) -> None:
    """Set ``found``'s options and measure to the best setting tried, and its error where that misses the budget."""
    budget = found.budget
    # the best setting; of equal ones the last tried (a step's middle comes last, `search`)
    options, achieved = min(reversed(found.tried), key=lambda t: abs(t[1] - budget.target))
    found.options, found.achieved = options, achieved
    if budget.met(achieved):
        found.error = None
        return
    values = [m for _, m in found.tried]
    below = max((m for m in values if m < budget.target), default=None)
    above = min((m for m in values if m > budget.target), default=None)
    name = {"omega_esr": "ΩESR", "omega_msr": "ΩMSR"}[budget.measure]
    if below is None or above is None:
        found.error = (f"{name} {budget.target:g} is out of reach: the knobs tried span {name} {min(values):.3f}–"
                       f"{max(values):.3f} on the calibration prompts")
    else:
        found.error = (f"no knob value meets {name} {budget.target:g} within {budget.tolerance:g}: the nearest reach "
                       f"{below:.3f} and {above:.3f} on the calibration prompts")


def describe(calibration: Calibration, label: str, length: int) -> str:
    """One line of what a calibration found, for the terminal."""
    knobs = ", ".join(f"{k}={v:g}" for k, v in calibration.options.items()) or "–"
    outcome = f"error: {calibration.error}" if calibration.error else "within tolerance"
    return (f"calibrated {label} at {length} tokens: {knobs} → {calibration.achieved:.4f} on the calibration prompts "
            f"({len(calibration.tried)} evaluations; {outcome})")


def held_out_table(rows: list[dict[str, Any]], output: str) -> str:
    """The terminal table of a budget run's outcome: per configuration and length, the knob values, the measure on the
    calibration prompts and its mean over the complete held-out cells, and whether both lie within the tolerance (or
    why the calibration found no value)."""
    from tabulate import tabulate

    from elastic_bench.results.store import Cell

    found: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for row in rows:
        metrics = Cell(output, row["model"], row["method"], row["task"], row["length"]).metrics() or {}
        if "target" in (metrics.get("calibration") or {}):
            found.setdefault((row["model"], row["method"], row["length"]), []).append(metrics)
    lines = []
    for (model, label, length), cells in found.items():
        record = cells[0]["calibration"]
        done = [c[record["measure"]] for c in cells if c.get("status") == "complete"]
        held = sum(done) / len(done) if done else math.nan
        met = record["within_tolerance"] and abs(held - record["target"]) <= record["tolerance"]
        knobs = ", ".join(f"{k}={v:g}" for k, v in record["knobs"].items())
        lines.append([model, label, length, knobs, f"{record['achieved']:.4f}", f"{held:.4f}" if done else "–",
                      "yes" if met else "no", record.get("error", "")])
    if not lines:
        return "(no budgeted cells)"
    note = ("calibration: the mean measure on the calibration split; held out: its mean over the complete cells of the "
            "length (each task's held-out prompts); within: both lie within the tolerance of the budget.")
    headers = ["model", "configuration", "length", "knobs", "calibration", "held out", "within", "note"]
    return tabulate(lines, headers=headers, disable_numparse=True) + "\n" + note
