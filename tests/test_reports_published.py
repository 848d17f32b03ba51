"""Reports: the paper's published figures beside the measured ones (a run folder whose model is named as a published
one, fake results), and the sparsity within δ of full attention against a brute-force computation of its rule."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

from elastic_bench.reports import load_cells, summarize, write_report
from elastic_bench.reports.bootstrap import LEVEL, RESAMPLES, SEED
from elastic_bench.reports.free_sparsity import free_sparsity, split_items
from elastic_bench.reports.published import load_published, matches, model_key
from elastic_bench.reports.tables import REPRODUCTION_TITLE
from elastic_bench.results.protocols import PAPER as PAPER_PROTOCOL
from elastic_bench.results.store import Cell

LLAMA = "meta-llama--Llama-3.1-8B-Instruct"
RULER = PAPER_PROTOCOL.benchmark("RULER").tasks  # the paper's 11


def write_cell(root, model, folder, task, length, scores, esr=0.5, options=None, preset=None, artifacts=None,
               resolved=None, extra=None):
    """A complete cell as the runner writes it: per-sample ``scores`` (fractions) and ΩESR ``esr`` (one value, or one
    per sample); ``resolved``: the unset options as the method ran with them; ``extra``: more ``metrics.json``
    fields (official sub-scores, provenance)."""
    cell = Cell(root, model, folder, task, length)
    cell.dir.mkdir(parents=True, exist_ok=True)
    esrs = esr if isinstance(esr, list) else [esr] * len(scores)
    for i, (score, e) in enumerate(zip(scores, esrs)):
        cell.append({"id": str(i), "score": score, "metadata": {}, "omega_msr": 0.7, "omega_esr": e})
    cell.finish({"status": "complete", "num_samples": len(scores), "method": folder.split("-")[0],
                 "method_options": options or {}, "preset": preset,
                 "fingerprint": {"artifacts": artifacts or {}}, "device": "NVIDIA H200", "backend_used": "split",
                 "score": 100 * sum(scores) / len(scores), "omega_msr": 0.7,
                 "omega_esr": sum(esrs) / len(esrs), "prefill_seconds_median": 1.0,
                 **({"method_resolved": resolved} if resolved else {}), **(extra or {})})


PAPER = {"preset": "elastic-paper"}
CONFIGS = {  # folder → (score fraction of every sample, cell metadata)
    "full": (0.90, {}),
    "xattention-preset=elastic-paper": (0.93, PAPER),
    "elastic-preset=elastic-paper-router=r-mode=fa-xa": (0.92, {**PAPER, "options": {"mode": "fa-xa"},
                                                                  "artifacts": {"router": "0123abcd"}}),
    "elastic-preset=elastic-paper-router=r2": (0.91, {**PAPER, "artifacts": {"router": "4567cdef"},
                                                       "resolved": {"mode": "fa-ssa"}}),  # the checkpoint's mode
    "elastic-router=r": (0.80, {"artifacts": {"router": "0123abcd"}}),  # no preset: not the paper's settings
    "xattention-preset=elastic-paper-threshold=0.8": (0.85, {**PAPER, "options": {"threshold": 0.8}}),  # overridden
    "duo_attention-preset=upstream-pattern=g": (0.70, {"preset": "upstream", "artifacts": {"pattern": "77"}}),
}


@pytest.fixture
def run_dir(tmp_path):
    root = tmp_path / "run"
    for model in (LLAMA, "not-a-published-model"):
        for folder, (score, meta) in CONFIGS.items():
            for task in [*RULER, "longbench_v2"]:
                write_cell(root, model, folder, task, 8192, [score, score], **meta)
    return root


def test_model_names_match_without_organisation_or_meta_prefix():
    assert model_key(LLAMA) == model_key("Meta-Llama-3.1-8B-Instruct") == model_key("Llama-3.1-8B-Instruct")
    assert model_key("Qwen--Qwen3-8B") == "qwen3-8b"


def test_the_shipped_figures_name_their_tables():
    published = load_published()
    # 21 rows (3 models × full, DuoAttention, PruLong, XAttention, Elastic's three modes) × (RULER: 6 lengths and the
    # Avg; LongBench-v2: Easy, Hard, Avg; LongBench-E: 13 tasks and the Avg)
    assert len(published.figures) == 21 * (7 + 3 + 14) and all(f.source.startswith("Table") for f in published.figures)
    assert published.protocol.name == "paper"
    flagged = {(f.model, f.method, f.mode, f.benchmark, f.breakdown, f.length): f.note
               for f in published.figures if f.note}
    assert "35.82" in flagged[("Llama-3.1-8B-Instruct", "xattention", None, "RULER", None, 262144)]
    assert "0.73" in flagged[("Llama-3.1-8B-Instruct", "elastic", "fa-ssa", "LongBench-v2", None, None)]  # ΩMSR
    assert sum("exact fraction" in note for note in flagged.values()) == 5 and len(flagged) == 7


def test_matched_configurations_show_the_published_value_and_the_difference(run_dir, tmp_path):
    llama, other = summarize(load_cells(run_dir))[0], summarize(load_cells(run_dir))[1]
    assert llama.title == LLAMA
    found = {(m.label, m.figure.name, m.length): m for m in matches(llama)}
    assert set(found) == {
        ("full", "RULER", 8192), ("full", "LongBench-v2", 8192),
        ("xattention (preset=elastic-paper)", "RULER", 8192),
        ("xattention (preset=elastic-paper)", "LongBench-v2", 8192),
        ("elastic (preset=elastic-paper, router=r, mode=fa-xa)", "RULER", 8192),
        ("elastic (preset=elastic-paper, router=r, mode=fa-xa)", "LongBench-v2", 8192),
        ("elastic (preset=elastic-paper, router=r2)", "RULER", 8192),
        ("elastic (preset=elastic-paper, router=r2)", "LongBench-v2", 8192),
    }  # no RULER average (one length of six), no Easy / Hard (no sub-scores recorded); the unpreset, overridden and
    # upstream configurations match nothing
    ruler = found[("full", "RULER", 8192)]
    assert (ruler.measured, ruler.figure.score, ruler.cells, ruler.protocol) == (90.0, 92.88, 11, "paper")
    assert ruler.difference == pytest.approx(-2.88)
    assert ruler.kind == "reproduction"  # nothing learned
    router = found[("elastic (preset=elastic-paper, router=r, mode=fa-xa)", "RULER", 8192)]
    assert (router.kind, router.why) == ("comparison", "router: provenance unknown")  # no provenance recorded
    v2 = found[("full", "LongBench-v2", 8192)]
    assert "416 of the 503 items" in v2.items and "not identifiable" in v2.items
    assert found[("elastic (preset=elastic-paper, router=r, mode=fa-xa)", "RULER", 8192)].figure.score == 92.82
    assert found[("xattention (preset=elastic-paper)", "LongBench-v2", 8192)].figure.score == 27.64
    assert found[("elastic (preset=elastic-paper, router=r2)", "RULER", 8192)].figure.mode == "fa-ssa"
    assert matches(other) == []

    write_report([llama, other], tmp_path / "report", source=str(run_dir))
    md = (tmp_path / "report" / "report.md").read_text()
    assert md.count(f"**{REPRODUCTION_TITLE}** · protocol: paper") == 1  # the unmatched model has none
    row = next(line for line in md.splitlines() if line.startswith("| full · RULER @ 8192"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:5] == ["reproduction", "90.00", "92.88", "-2.88"]
    html = (tmp_path / "report" / "report.html").read_text()
    assert REPRODUCTION_TITLE in html


def test_the_ruler_average_needs_every_length_and_is_the_mean_of_the_length_means(tmp_path):
    root = tmp_path / "run"
    lengths = PAPER_PROTOCOL.benchmark("RULER").lengths
    for i, length in enumerate(lengths):
        for j, task in enumerate(RULER):
            write_cell(root, LLAMA, "full", task, length, [(50 + i + j % 2) / 100])
    (comparison,) = summarize(load_cells(root))
    (average,) = [m for m in matches(comparison) if m.length is None and m.figure.benchmark == "RULER"]
    per_length = [np.mean([(50 + i + j % 2) for j in range(len(RULER))]) for i in range(len(lengths))]
    assert average.measured == pytest.approx(np.mean(per_length))
    assert (average.figure.score, average.cells) == (83.47, 11 * 6)


# ---- sparsity within δ of full attention ---------------------------------------------------------------------------


def brute_interval(values: list[float]) -> tuple[float, float, float]:
    """Percentile bootstrap of the mean of one cell's values, one resample at a time: each resample draws how often
    every value is taken (the generator's multinomial draws in the order `bootstrap.clustered_interval` takes them:
    per chunk of 256 resamples)."""
    rng = np.random.default_rng(SEED)
    means = []
    for start in range(0, RESAMPLES, 256):
        rows = min(256, RESAMPLES - start)
        draws = rng.multinomial(len(values), [1 / len(values)] * len(values), size=rows)
        means += [sum(k * v for k, v in zip(draw, values)) / len(values) for draw in draws]
    low, high = np.quantile(means, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return sum(values) / len(values), float(low), float(high)


def halves(task: str, n: int) -> tuple[list[int], list[int]]:
    """The sample ids of a task's selection and confirmation halves: in the order of the SHA-256 of
    ``task\\0id``, alternately."""
    ordered = sorted(range(n), key=lambda i: hashlib.sha256(f"{task}\0{i}".encode()).hexdigest())
    return sorted(ordered[0::2], key=str), sorted(ordered[1::2], key=str)  # matched samples come in id order


def test_sparsity_within_delta_matches_a_brute_force_computation(tmp_path):
    rng = np.random.default_rng(7)
    root = tmp_path / "run"
    tasks = {"ruler_niah_single_1": "retrieval (NIAH)", "ruler_qa_1": "question answering (QA)"}
    n = 24
    full = {t: rng.integers(60, 100, size=n) / 100 for t in tasks}
    # (drop in score points, ΩESR): the sparser configurations lose more
    configs = {"duo_attention-sparsity=0.3": (0, 0.2), "duo_attention-sparsity=0.5": (2, 0.4),
               "duo_attention-sparsity=0.7": (12, 0.6), "xattention": (30, 0.8)}
    samples = {}
    for task in tasks:
        write_cell(root, "m", "full", task, 4096, list(full[task]), esr=0.0)
        for folder, (drop, esr) in configs.items():
            scores = list(np.clip(full[task] - (drop + rng.integers(-3, 4, size=n)) / 100, 0, 1))
            esrs = list(esr + rng.uniform(-0.05, 0.05, size=n))
            write_cell(root, "m", folder, task, 4096, scores, esr=esrs)
            samples[(folder, task)] = (scores, esrs)
    (comparison,) = summarize(load_cells(root))
    delta = 3.5
    got = {(f.method, f.category): f for f in free_sparsity(comparison, delta)}

    for method in ("duo_attention", "xattention"):
        for task, category in tasks.items():
            selection, confirmation = halves(task, n)
            keys = [(task, 4096)]
            assert split_items(keys, comparison.configs[0]) == ({(task, str(i)) for i in selection},
                                                                {(task, str(i)) for i in confirmation})
            passing = []
            for folder in (f for f in configs if f.split("-")[0] == method):
                scores, esrs = samples[(folder, task)]
                diff = brute_interval([100 * (scores[i] - full[task][i]) for i in selection])
                if diff[1] >= -delta:
                    passing.append((brute_interval(esrs)[0], folder, brute_interval(esrs)))
            result = got[(method, category)]
            if not passing:
                assert result.label is None and result.omega_esr is None and not result.confirmed
                continue
            _, folder, esr = max(passing)
            scores, _ = samples[(folder, task)]
            held_out = brute_interval([100 * (scores[i] - full[task][i]) for i in confirmation])
            assert result.label == comparison.configs[[c.method for c in comparison.configs].index(folder)].label
            assert (result.difference.mean, result.difference.low, result.difference.high) == pytest.approx(held_out)
            assert result.confirmed == (held_out[1] >= -delta)
            assert (result.omega_esr.mean, result.omega_esr.low, result.omega_esr.high) == pytest.approx(esr)
            assert result.tried == sum(f.split("-")[0] == method for f in configs)
    # the rule is exercised: a sparser configuration exists beyond δ, and xattention stays out
    chosen = {got[("duo_attention", c)].label for c in tasks.values()}
    assert None not in chosen and "duo_attention (s=0.7)" not in chosen
    assert any(got[("duo_attention", c)].confirmed for c in tasks.values())
    assert all(got[("xattention", c)].label is None for c in tasks.values())
    assert not math.isnan(got[("xattention", "question answering (QA)")].difference.low)
