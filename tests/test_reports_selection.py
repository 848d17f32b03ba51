"""Statistics that survive choosing: ``report --delta`` over many configurations of pure noise claims "within δ at
higher sparsity" no more often than its nominal error rate (and the rule it replaced does, far more often), and
``compare``'s pairs carry Holm's family-wise correction."""

from __future__ import annotations

import math

import numpy as np

from elastic_bench import cli
from elastic_bench.reports import compare, load_cells, run_names
from elastic_bench.reports.bootstrap import holm, paired_difference
from elastic_bench.reports.collect import CellResult, SampleResult
from elastic_bench.reports.free_sparsity import ERROR_RATE, free_sparsity
from elastic_bench.reports.summary import Comparison, Config, paired_scores
from elastic_bench.results.store import Cell

RUNS, CONFIGS, ITEMS, LENGTHS, RESAMPLES = 200, 12, 60, (4096, 8192), 400
TASK = "ruler_niah_single_1"


def _config(folder: str, scores: np.ndarray, esr: float) -> Config:
    """A configuration in memory: one RULER task at two lengths, item ``i`` scoring ``scores[l, i]`` at length ``l``
    (the same item ids at both lengths: one item, two cells)."""
    cells = {}
    for row, length in enumerate(LENGTHS):
        cell = CellResult(model="m", method=folder, task=TASK, length=length, status="complete",
                          score=float(scores[row].mean()), omega_msr=esr, omega_esr=esr, prefill_seconds=1.0,
                          num_samples=ITEMS, method_name=folder.split("-")[0])
        vars(cell)["samples"] = [SampleResult(str(i), float(s), esr, esr) for i, s in enumerate(scores[row])]
        cells[(TASK, length)] = cell
    return Config(run="", model="m", method=folder, method_name=folder.split("-")[0], options={}, artifacts={},
                  label=folder, cells=cells)


def _noise(rng: np.random.Generator) -> Comparison:
    """Full attention and ``CONFIGS`` sparser configurations whose scores have the same distribution as full's by
    construction: each item has a difficulty shared by its two lengths and by every configuration, and each score is
    that difficulty plus independent noise."""
    difficulty = rng.uniform(30, 90, ITEMS)
    draw = lambda: difficulty + rng.normal(0, 15, (len(LENGTHS), ITEMS))  # noqa: E731
    configs = [_config("full", draw(), 0.0)]
    configs += [_config(f"duo_attention-sparsity={(k + 1) / (CONFIGS + 1):.3f}", draw(), (k + 1) / (CONFIGS + 1))
                for k in range(CONFIGS)]
    return Comparison("noise", configs, [(TASK, n) for n in LENGTHS], [])


def _binomial_quantile(n: int, p: float, q: float) -> int:
    """The smallest k with P(Binomial(n, p) ≤ k) ≥ q."""
    total = 0.0
    for k in range(n + 1):
        total += math.comb(n, k) * p**k * (1 - p) ** (n - k)
        if total >= q:
            return k
    return n


def test_sparsity_within_delta_over_pure_noise_claims_no_more_than_its_nominal_error_rate():
    """At δ = 0 every configuration, equal to full by construction, sits on the boundary of "within δ": any claim
    that one is within δ is the test's error. The rule chooses on half of the items and confirms on the other; the
    rule it replaced (the sparsest configuration whose interval over all the items reached −δ) claims one whenever
    any of the twelve passes by chance."""
    rng = np.random.default_rng(2026_12_03)
    today = chosen = 0
    for _ in range(RUNS):
        comparison = _noise(rng)
        (found,) = free_sparsity(comparison, delta=0.0, resamples=RESAMPLES)
        assert found.tried == CONFIGS
        chosen += found.confirmed
        full = comparison.configs[0]
        today += any(paired_difference(*paired_scores(c, full)[:2], resamples=RESAMPLES).low >= 0
                     for c in comparison.configs[1:])
    allowed = _binomial_quantile(RUNS, ERROR_RATE, 0.99)  # the nominal rate, with the simulation's own spread
    print(f"claims over {RUNS} pure-noise runs of {CONFIGS} configurations: the earlier rule "
          f"{100 * today / RUNS:.1f}%, the split rule {100 * chosen / RUNS:.1f}% (nominal {100 * ERROR_RATE:g}%)")
    assert chosen <= allowed
    assert today > 2 * allowed  # the earlier rule fails the same test


def _cell(root, method, length, scores):
    cell = Cell(root, "m", method, "t", length)
    cell.dir.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(scores):
        cell.append({"id": str(i), "score": s, "metadata": {}, "omega_msr": 0.0, "omega_esr": 0.0})
    cell.finish({"status": "complete", "num_samples": len(scores), "method": method, "method_options": {},
                 "fingerprint": {"artifacts": {}}, "device": "NVIDIA H200", "backend_used": "split",
                 "score": 100 * sum(scores) / len(scores), "omega_msr": 0.0, "omega_esr": 0.0,
                 "prefill_seconds_median": 1.0})


def test_compare_names_holm_and_a_pair_that_differs_only_before_the_correction_does_not(tmp_path):
    rng = np.random.default_rng(11)
    base = rng.uniform(0.2, 0.8, 40)
    runs = []
    for r in range(3):
        root = tmp_path / f"run{r}"
        for method, extra in (("full", 0.0), ("streaming", 0.02)):  # streaming a little better
            _cell(root, method, 1024, list(np.clip(base + extra + rng.normal(0, 0.06, 40), 0, 1)))
        runs.append(str(root))
    assert cli.main(["compare", *runs, "--output", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp" / "report.md").read_text()
    assert "Holm-adjusted over the family" in md and "**Paired differences (score points, paired bootstrap 95% " \
        "interval, Holm-adjusted)** · protocol: official" in md
    (comparison,) = compare([c for r, name in zip(runs, run_names(runs)) for c in load_cells(r, run=name)])
    pairs = comparison.pairs()
    assert len(pairs) == 15  # 6 configurations: 15 pairs, one family
    p = np.array([x.difference.p_value for x in pairs])
    assert [x.holm for x in pairs] == holm(list(p)) and all(x.holm >= x.difference.p_value for x in pairs)
    assert any(x.difference.p_value < 0.05 <= x.holm for x in pairs)  # the correction changes an answer
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines()
            if line.startswith("| run") and " − " in line]
    assert [r[7] for r in rows] == ["yes" if x.holm < 0.05 else "no" for x in pairs]
