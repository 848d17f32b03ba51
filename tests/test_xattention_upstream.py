"""XAttention's default block selection against upstream's rule, the strict rule kept as an option, the rule through
Elastic's `ModeConfig`, and per-head τ tables.

`upstream_selection` writes upstream's algorithm out independently (mit-han-lab/x-attention: ``find_blocks_chunked``
once per query chunk of ``xattn_estimate``, chunk size from ``Xattention_prefill``, then the causal crop), step by
step: the forced column 0, the diagonal "eye" over the chunk's columns, the running sums laid out for two forced
blocks, and untaken slots written into column 0. It is compared with `xattention_select` on the same block scores.

The Triton cases run in a child process under ``TRITON_INTERPRET=1`` (see tests/test_kernels_triton.py for why).
"""

from __future__ import annotations

import os
from functools import cache

import numpy as np
import pytest
import torch
from test_kernels_triton import print_case_results, run_interpreted

from elastic_bench import apply, get_method
from elastic_bench.kernels.xattention import antidiagonal_scores, select_blocks, xattention_select
from elastic_bench.method.modes import OFFICIAL_XA_THRESHOLD, ModeConfig

# ---- upstream's rule, written out ----------------------------------------------------------------------------------


def upstream_chunk_tokens(k_len: int) -> int:
    """``Xattention_prefill``'s automatic chunk size: P = the power of two reached from 1 by doubling up to k_len."""
    p = 1
    while p < k_len:
        p *= 2
    return max(min(max(2048, p), 2**28 // p), 2048)


def upstream_selection(scores: np.ndarray, tau: np.ndarray, k_len: int, block_size: int) -> np.ndarray:
    """Upstream's selection of a one-shot causal prefill: bool ``[Hq, nB, nB]`` from block scores ``[Hq, nB, nB]``
    and thresholds ``[Hq]``."""
    Hq, nB, _ = scores.shape
    rows = upstream_chunk_tokens(k_len) // block_size  # query-block rows per estimation chunk
    n = -(-nB // rows) * rows  # upstream pads queries and keys to whole chunks
    padded = np.zeros((Hq, n, n))
    padded[:, :nB, :nB] = scores
    mask = np.zeros((Hq, n, n), dtype=bool)
    for h in range(Hq):
        for start in range(0, n, rows):  # chunk i starts at block row i · rows (its "current index")
            for r in range(start, start + rows):
                mask[h, r] = _upstream_row(padded[h, r], tau[h], start, rows, r)
    mask &= np.tri(n, dtype=bool)  # the final causal crop
    return mask[:, :nB, :nB]


def _upstream_row(row: np.ndarray, tau: float, start: int, rows: int, r: int) -> np.ndarray:
    required = tau * row.sum()
    forced = np.zeros(len(row), dtype=bool)
    forced[0] = True
    forced[start : start + rows] = np.arange(start, start + rows) == r  # the eye: in chunk 0 it clears column 0
    others = np.sort(np.where(forced, 0.0, row))[::-1]
    # the mass before each slot of the order below, laid out as if slots 0 and 1 were the two forced blocks
    layout = np.concatenate([[0.0, row[forced].sum()], others[:-2]])
    before = np.cumsum(np.concatenate([[0.0], layout[:-1]]))
    order = np.argsort(-np.where(forced, 1e5 * (1 + row), row), kind="stable")  # forced blocks first
    out = np.zeros(len(row), dtype=bool)
    out[np.where(before < required, order, 0)] = True  # an untaken slot marks column 0
    return out


def strict_selection(scores: np.ndarray, tau: np.ndarray) -> np.ndarray:
    """The strict rule row by row: blocks 0 and r counted, then candidates while the mass before them is short."""
    Hq, nB, _ = scores.shape
    mask = np.zeros((Hq, nB, nB), dtype=bool)
    for h in range(Hq):
        for r in range(nB):
            row = scores[h, r]
            mask[h, r, [0, r]] = True
            mass, required = row[0] + (row[r] if r else 0.0), tau[h] * row.sum()
            for c in sorted(range(1, r), key=lambda c: -row[c]):
                if mass >= required:
                    break
                mask[h, r, c], mass = True, mass + row[c]
    return mask


# ---- inputs ------------------------------------------------------------------------------------------------------


@cache
def peaked_inputs(length: int, kv_heads: int = 1, group: int = 2, dim: int = 16, seed: int = 0):
    """q ``[1, kv_heads · group, length, dim]``, k ``[1, kv_heads, length, dim]``: keys carry a per-128-token weight
    along a direction the queries share, so block scores are uneven and selections neither empty nor full."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(kv_heads, 1, dim, generator=gen)
    q = u.repeat_interleave(group, 0) + 0.5 * torch.randn(1, kv_heads * group, length, dim, generator=gen)
    w = torch.randn(kv_heads, -(-length // 128), 1, 1, generator=gen)
    k = (w * u[:, None]).repeat_interleave(128, 1).flatten(1, 2)[:, :length] + torch.randn(
        1, kv_heads, length, dim, generator=gen)
    return q, k


@cache
def block_scores(length: int, block_size: int = 128) -> torch.Tensor:
    q, k = peaked_inputs(length)
    return antidiagonal_scores(q, k, 16, block_size, backend="reference")


def _tau(threshold, heads: int) -> np.ndarray:
    """τ ``[heads]`` as `xattention_select` sees it (float32 values)."""
    return np.broadcast_to(np.asarray(threshold, dtype=np.float32).astype(np.float64), (heads,))


def _dense(selection, n: int) -> np.ndarray:
    return selection.to_dense(n)[0].numpy()


# ---- the upstream rule (reference backend) ----------------------------------------------------------------------


@pytest.mark.parametrize(("length", "threshold"), [(2048, 0.9), (20000, 0.9), (20000, [0.8, 0.95])])
def test_default_selection_is_upstreams_first_chunk_included(length, threshold):
    q, k = peaked_inputs(length)
    tau = torch.tensor(threshold) if isinstance(threshold, list) else threshold
    scores = block_scores(length).double().numpy()[0]
    n = scores.shape[-1]
    expected = upstream_selection(scores, _tau(threshold, 2), length, 128)
    got = _dense(xattention_select(q, k, tau, 16, 128, backend="reference"), n)
    assert (got == expected).all(), np.argwhere(got != expected)[:5]
    assert 0.05 < got.sum() / (2 * n * (n + 1) / 2) < 0.8  # a selective case
    # the first chunk is where the rules differ: its rows would catch a strict rule; the others follow it
    first = upstream_chunk_tokens(length) // 128
    strict = _dense(xattention_select(q, k, tau, 16, 128, backend="reference", rule="strict"), n)
    assert (strict[:, :first] != expected[:, :first]).any(-1).mean() > 0.5
    assert (strict[:, first:] == expected[:, first:]).all()
    assert first == (16 if length == 2048 else 64)  # 2K: every row is in the first chunk; 20K: 8192 tokens


def test_upstream_first_chunk_on_a_known_row():
    # Row 4 at τ 0.5 (target 0.5). In the first chunk only the diagonal (0.30) counts up front and block 0 (0.02) is a
    # candidate: by descending score block 1 (0.5) is compared with 0, block 2 (0.1) with 0.30 (the lag: block 1's
    # mass is not yet in) and taken, block 3 (0.08) with 0.80, not; block 0 is kept anyway. Strict: 0.32 up front,
    # block 1 taken with 0.32 < 0.5 before it, block 2 not (0.82).
    scores = torch.zeros(1, 1, 5, 5)
    scores[0, 0, 4] = torch.tensor([0.02, 0.5, 0.1, 0.08, 0.3])
    upstream = [True, True, True, False, True]
    strict = [True, True, False, False, True]
    assert select_blocks(scores, 0.5, 640, 640, 128, backend="reference")[0, 0, 4].tolist() == upstream
    assert select_blocks(scores, 0.5, 640, 640, 128, backend="reference", rule="strict")[0, 0, 4].tolist() == strict
    # 20K keys in blocks of 4096: the first chunk (8192 tokens) is rows 0-1, so row 4 follows the strict rule
    assert select_blocks(scores, 0.5, 20000, 20000, 4096, backend="reference")[0, 0, 4].tolist() == strict
    assert upstream_selection(scores.double().numpy()[0], _tau(0.5, 1), 640, 128)[0, 4].tolist() == upstream
    # τ 0 keeps block 0 and the diagonal under both rules
    for rule in ("upstream", "strict"):
        assert select_blocks(scores, 0.0, 640, 640, 128, backend="reference", rule=rule)[0, 0, 4].tolist() == [
            True, False, False, False, True]


def test_strict_rule_is_still_available():
    q, k = peaked_inputs(2048)
    scores = block_scores(2048).double().numpy()[0]
    got = _dense(xattention_select(q, k, 0.9, 16, 128, backend="reference", rule="strict"), scores.shape[-1])
    assert (got == strict_selection(scores, _tau(0.9, 2))).all()
    with pytest.raises(ValueError, match="rule must be one of upstream, strict; got 'exact'"):
        xattention_select(q, k, rule="exact")


@pytest.mark.parametrize(("length", "offset_blocks"), [(2560, 12), (20000, 63)])
def test_a_prefill_chunk_gets_the_one_shot_rows(length, offset_blocks):
    """A chunk starting on a block boundary: its rows are those of a one-shot prefill of the same keys (20K: the
    chunk starts on the last first-chunk row)."""
    q, k = peaked_inputs(length)
    n = -(-length // 128)
    one_shot = _dense(xattention_select(q, k, backend="reference"), n)
    chunk = _dense(xattention_select(q[:, :, offset_blocks * 128 :], k, backend="reference"), n)
    assert (chunk[:, offset_blocks:] == one_shot[:, offset_blocks:]).all()
    assert not chunk[:, :offset_blocks].any()


# ---- Elastic: the rule and τ through ModeConfig ------------------------------------------------------------------


def test_mode_config_passes_the_rule_and_names_the_official_threshold():
    q, k = peaked_inputs(2048)
    assert ModeConfig().xa_rule == "upstream" and ModeConfig().xa_threshold == 0.9 and OFFICIAL_XA_THRESHOLD == 0.8
    for rule in ("upstream", "strict"):
        plan = ModeConfig(mode="fa-xa", xa_rule=rule).side_plan(False, q, k)
        expected = xattention_select(q, k, 0.9, 16, 128, backend="reference", rule=rule)
        assert torch.equal(plan.blocks.to_dense(16), expected.to_dense(16))
    official = ModeConfig(mode="xa-ssa", xa_threshold=OFFICIAL_XA_THRESHOLD).side_plan(True, q, k)
    expected = xattention_select(q, k, 0.8, 16, 128, backend="reference")
    assert torch.equal(official.blocks.to_dense(16), expected.to_dense(16))
    with pytest.raises(ValueError, match="xa_rule must be one of upstream, strict"):
        ModeConfig(xa_rule="loose")


# ---- per-head τ tables --------------------------------------------------------------------------------------------


def write_table(tmp_path, table, name="thresholds.tsv"):
    path = tmp_path / name
    np.savetxt(path, np.asarray(table), delimiter="\t", fmt="%.6f")
    return path


def test_threshold_table_is_an_artifact_and_validated_early(tmp_path):
    path = write_table(tmp_path, [[0.9, 0.8, 0.95, 0.9], [0.7, 0.9, 0.9, 1.0]])
    assert get_method("xattention", thresholds=str(path)).artifacts("any") == {"thresholds": path}
    assert get_method("xattention").artifacts("any") == {}
    with pytest.raises(FileNotFoundError, match="no XAttention threshold table at"):
        get_method("xattention", thresholds=str(tmp_path / "missing.tsv"))
    with pytest.raises(ValueError, match="τ = 1.5 at layer 1, query head 0"):
        get_method("xattention", thresholds=str(write_table(tmp_path, [[0.9, 0.9], [1.5, 0.9]], "high.tsv")))
    (tmp_path / "words.tsv").write_text("0.9\tnine\n")
    with pytest.raises(ValueError, match="not a tab-separated table of numbers"):
        get_method("xattention", thresholds=str(tmp_path / "words.tsv"))
    (tmp_path / "empty.tsv").write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        get_method("xattention", thresholds=str(tmp_path / "empty.tsv"))
    with pytest.raises(ValueError, match="give threshold or thresholds, not both"):
        get_method("xattention", thresholds=str(path), threshold=0.8)
    with pytest.raises(ValueError, match="must be one of 'upstream', 'strict'"):
        get_method("xattention", rule="loose")


def test_threshold_table_must_match_the_model(tiny_models, tmp_path):
    model, _ = tiny_models["llama"]  # 2 layers × 4 query heads
    path = write_table(tmp_path, np.full((2, 2), 0.9))
    with pytest.raises(ValueError, match=r"2 layers × 2 query heads; the model has 2 layers × 4 query heads$"):
        with apply(get_method("xattention", thresholds=str(path)), model):
            pass


def test_threshold_table_sets_each_layers_query_heads(tiny_models, tmp_path, monkeypatch):
    from elastic_bench.baselines import xattention as baseline

    model, tokenizer = tiny_models["qwen3"]
    table = [[0.0, 0.5, 0.9, 1.0], [1.0, 1.0, 1.0, 1.0]]
    seen = {}

    def spy(query, key, threshold, *args, **kwargs):
        seen[len(seen)] = threshold.tolist()
        return xattention_select(query, key, threshold, *args, **kwargs)

    monkeypatch.setattr(baseline, "xattention_select", spy)
    ids = tokenizer("needle in a haystack " * 20, return_tensors="pt").input_ids
    method = get_method("xattention", thresholds=str(write_table(tmp_path, table)), stride=8, block_size=16)
    with torch.no_grad(), apply(method, model):
        model(ids)
    assert seen == {0: pytest.approx(table[0]), 1: pytest.approx(table[1])}


# ---- Triton against upstream's rule (interpreter, child process) ------------------------------------------------

# name: (tokens, block size, τ per query head); keys of 20K in blocks of 1024 keep the interpreter fast while the
# first chunk (8192 tokens, 8 rows) still ends mid-sequence
TRITON_CASES = {
    "2k": (2048, 128, [0.9, 0.9]),
    "20k_block1024": (20000, 1024, [0.85, 0.95]),
}


def _run_triton_case(name: str) -> dict:
    length, block_size, tau = TRITON_CASES[name]
    scores = block_scores(length, block_size)
    n = scores.shape[-1]
    expected = upstream_selection(scores.double().numpy()[0], _tau(tau, 2), length, block_size)

    def select(rule, backend):
        return select_blocks(scores, torch.tensor(tau), length, length, block_size, backend=backend, rule=rule)

    strict_ref = select("strict", "reference")
    return {
        "upstream_mismatch": int((select("upstream", "triton")[0].numpy() != expected).sum()),
        "strict_mismatch": int((select("strict", "triton") != strict_ref).sum()),
        "rules_differ": bool((strict_ref[0].numpy() != expected).any()),
        "density": float(expected.sum() / (2 * n * (n + 1) / 2)),
    }


@pytest.fixture(scope="module")
def triton_results() -> dict:
    return run_interpreted(__file__)


@pytest.mark.parametrize("name", list(TRITON_CASES))
def test_triton_selection_is_upstreams(triton_results, name):
    r = triton_results[name]
    assert "error" not in r, r.get("error")
    assert r["upstream_mismatch"] == 0 and r["strict_mismatch"] == 0
    assert r["rules_differ"] and 0 < r["density"] < 1


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1"
    print_case_results(TRITON_CASES, _run_triton_case)
