"""XAttention block selection: the PyTorch reference against the specification, and the Triton and cuBLAS-GEMM
backends against the reference.

The Triton cases run in a child process under ``TRITON_INTERPRET=1`` (see tests/test_kernels_triton.py for why).
"""

from __future__ import annotations

import os

import pytest
import torch
from test_kernels_triton import print_case_results, run_interpreted

from elastic_bench.kernels.xattention import antidiagonal_scores, select_blocks, xattention_select


def _brute_scores(q, k, stride, block_size):
    """The specification written out tile by tile: [B, Hq, nB, nB]."""
    B, Hq, Lq, D = q.shape
    H, Lk = k.shape[1], k.shape[2]
    S, off = stride, Lk - Lq
    n_t = -(-Lk // block_size) * (block_size // S)

    def qrow(b, h, pos):
        return q[b, h, pos - off].double() if off <= pos < Lk else torch.zeros(D, dtype=torch.float64)

    def krow(b, h, pos):
        return k[b, h, pos].double() if pos < Lk else torch.zeros(D, dtype=torch.float64)

    per = block_size // S
    out = torch.zeros(B, Hq, n_t // per, n_t // per, dtype=torch.float64)
    for b in range(B):
        for hq in range(Hq):
            h = hq // (Hq // H)
            for tq in range(n_t):
                if not ((tq + 1) * S > off and tq * S < Lk):
                    continue
                logits = torch.full((n_t,), float("-inf"), dtype=torch.float64)
                for tk in range(min(tq + 1, -(-Lk // S))):
                    logits[tk] = sum(qrow(b, hq, tq * S + S - 1 - u) @ krow(b, h, tk * S + u) for u in range(S))
                p = torch.softmax(logits / (D**0.5 * S), 0)
                out[b, hq, tq // per] += p.view(-1, per).sum(1)
    return out


def test_scores_follow_the_specification():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 45, 8, generator=gen), torch.randn(1, 2, 70, 8, generator=gen)
    got = antidiagonal_scores(q, k, stride=4, block_size=16, backend="reference")
    assert torch.allclose(got.double(), _brute_scores(q, k, 4, 16), atol=1e-5)


def test_strict_selection_rule_on_a_known_row():
    # Row 4: sink 0.30 and diagonal 0.10 are forced (0.40 of the 0.70 target). By descending score, 0.25 (block 2) is
    # added with 0 before it, 0.20 (block 1) with 0.25 < 0.30 before it (it crosses), 0.15 (block 3) not: 0.45 >= 0.30.
    # (The upstream rule of tests/test_xattention_upstream.py differs on this row: it is in the first chunk.)
    scores = torch.zeros(1, 1, 5, 5)
    scores[0, 0, 4] = torch.tensor([0.30, 0.20, 0.25, 0.15, 0.10])

    def row(tau):
        return select_blocks(scores, tau, 640, 640, 128, backend="reference", rule="strict")[0, 0, 4].tolist()

    assert row(0.7) == [True, True, True, False, True]
    assert row(0.0) == [True, False, False, False, True]
    assert all(row(1.0))


def test_selection_keeps_sink_and_diagonal_and_grows_with_tau():
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 4, 300, 16, generator=gen), torch.randn(2, 2, 300, 16, generator=gen)
    scores = antidiagonal_scores(q, k, 8, 32, backend="reference")
    n = scores.shape[-1]
    previous = None
    for tau in (0.0, 0.3, 0.6, 0.9, 1.0):
        sel = select_blocks(scores, tau, 300, 300, 32, backend="reference")
        assert sel[..., 0].all() and sel.diagonal(dim1=-2, dim2=-1).all()
        assert not (sel & torch.ones(n, n, dtype=torch.bool).triu(1)).any()  # nothing above the diagonal
        mass = (scores * sel).sum(-1) / scores.sum(-1)
        assert (mass >= tau - 1e-5).all()  # the target mass is reached on every row
        if previous is not None:
            assert (sel | ~previous).all()  # a larger τ only adds blocks
        previous = sel


def test_unscored_heads_and_rows_before_the_chunk_are_empty():
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 4, 100, 16, generator=gen), torch.randn(1, 2, 300, 16, generator=gen)
    sel = xattention_select(q, k, 0.9, 8, 32, heads=torch.tensor([[True, False]]), backend="reference")
    counts = sel.counts[0]
    assert (counts[2:] == 0).all()  # query heads of KV head 1
    assert (counts[:2, : (300 - 100) // 32] == 0).all()  # query blocks with no query of this chunk
    assert (counts[:2, (300 - 100) // 32 :] > 0).all()


@pytest.mark.gpu
def test_gpu_selection_matches_reference():
    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(1, 8, 4096, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
    k = torch.randn(1, 2, 4096, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
    ref = xattention_select(q, k, 0.9, 16, 128, backend="reference").to_dense(32)
    for backend in ("triton", "gemm"):
        got = xattention_select(q, k, 0.9, 16, 128, backend=backend).to_dense(32)
        assert (ref != got).float().mean() < 1e-3, backend  # bf16 sums in another order may flip a block at τ


def test_gpu_backends_need_triton():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("interpreter enabled in this process")
    q, k = torch.randn(1, 2, 64, 16), torch.randn(1, 1, 64, 16)
    with pytest.raises(RuntimeError, match="not available"):
        xattention_select(q, k, backend="gemm")
    with pytest.raises(ValueError, match="auto, triton, gemm or reference"):
        xattention_select(q, k, backend="cublas")


def test_auto_scores_with_triton_below_gemm_min_keys_and_with_gemm_from_there(monkeypatch):
    from elastic_bench.kernels import xattention

    monkeypatch.setattr(xattention, "triton_available", lambda device: True)
    cuda = torch.device("cuda")
    assert xattention._backend("auto", cuda, xattention.GEMM_MIN_KEYS - 1) == "triton"
    assert xattention._backend("auto", cuda, xattention.GEMM_MIN_KEYS) == "gemm"
    assert xattention._backend("auto", torch.device("cpu"), 1 << 20) == "reference"
    assert xattention._backend("triton", cuda, 1 << 20) == "triton"  # an explicit backend is kept


def test_gemm_chunks_are_block_rows_within_the_scratch_bound():
    from elastic_bench.kernels.xattention.fused import GEMM_SCRATCH_BYTES, _chunk_tiles

    # stride 16, 32 query heads: query tiles = key tiles = tokens / 16; rows per tile 32; 2 bytes (bf16), 4 (fp32)
    shapes = [(tiles, size) for tiles in (8192, 16384, 65536) for size in (2, 4)]
    chunks = {(tiles, size): _chunk_tiles(tiles, tiles, 32, size, 8) for tiles, size in shapes}
    assert all(c % 8 == 0 and 32 * c * tiles * size <= GEMM_SCRATCH_BYTES for (tiles, size), c in chunks.items())
    assert chunks[8192, 2] == 512 and chunks[16384, 2] == 1024  # 128K: 16 chunks (256 MiB); 256K: 16 (1 GiB)
    assert chunks[65536, 2] == 256  # 1M: capped by the scratch bound


# ---- Triton against the reference (interpreter, child process) ------------------------------------------------------

# name: (B, H, G, Lq, Lk, D, stride, block_size, threshold, heads)
CASES = {  # (B, H, G, Lq, Lk, D, stride, block size, tau, heads, strided: q and k laid out as a model's)
    "gqa4_stride8": (1, 2, 4, 300, 300, 32, 8, 32, 0.9, None, False),
    "gqa1_stride16_q_shorter": (2, 2, 1, 100, 333, 16, 16, 64, 0.8, [[True, False], [True, True]], False),
    "per_head_tau": (1, 1, 4, 256, 256, 64, 4, 16, [0.5, 0.7, 0.9, 1.0], None, False),
    "stride16_block128": (1, 1, 2, 700, 700, 16, 16, 128, 0.9, None, False),
    "gqa4_stride16_q_shorter": (1, 2, 4, 150, 520, 16, 16, 64, 0.9, [[False, True]], False),
    "model_layout_head_subset": (1, 2, 4, 256, 256, 16, 16, 64, 0.9, [[True, False]], True),
}


_CSR_FIELDS = ("counts", "offsets", "indices")


def _case(name: str) -> tuple:
    """(q, k, tau, stride, block size, heads, Lq, Lk) of case ``name``."""
    B, H, G, Lq, Lk, D, stride, bs, tau, heads, strided = CASES[name]
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    q, k = torch.randn(B, H * G, Lq, D, generator=gen), torch.randn(B, H, Lk, D, generator=gen)
    if strided:  # [B, L, heads, D] memory seen as [B, heads, L, D], as attention modules hand them over
        q, k = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k))
    heads = torch.tensor(heads) if heads is not None else None
    return q, k, torch.tensor(tau) if isinstance(tau, list) else tau, stride, bs, heads, Lq, Lk


def _run_case(name: str) -> dict:
    q, k, tau, stride, bs, heads, Lq, Lk = _case(name)
    ref = antidiagonal_scores(q, k, stride, bs, heads, backend="reference")
    tri = antidiagonal_scores(q, k, stride, bs, heads, backend="triton")
    sel_ref = select_blocks(ref, tau, Lq, Lk, bs, heads, backend="reference")
    sel_tri = select_blocks(ref, tau, Lq, Lk, bs, heads, backend="triton")
    csr_ref = xattention_select(q, k, tau, stride, bs, heads, backend="reference")
    csr_tri = xattention_select(q, k, tau, stride, bs, heads, backend="triton")
    return {
        "score_error": float((ref - tri).abs().max()),
        "selection_mismatch": int((sel_ref != sel_tri).sum()),
        "csr_equal": all(torch.equal(getattr(csr_ref, f), getattr(csr_tri, f)) for f in _CSR_FIELDS),
        "density": float(sel_ref.float().mean()),
    }


def _run_gemm_case(name: str) -> dict:
    """The GEMM backend: default chunks (one at these lengths) and chunks of two block rows."""
    from elastic_bench.kernels.xattention.fused import antidiagonal_scores_gemm

    q, k, tau, stride, bs, heads, Lq, Lk = _case(name)
    ref = antidiagonal_scores(q, k, stride, bs, heads, backend="reference")
    chunked = antidiagonal_scores_gemm(q, k, stride, bs, heads, chunk_tiles=2 * bs // stride)
    csr_ref = xattention_select(q, k, tau, stride, bs, heads, backend="reference")
    csr = xattention_select(q, k, tau, stride, bs, heads, backend="gemm")
    return {
        "score_error": float((ref - antidiagonal_scores(q, k, stride, bs, heads, backend="gemm")).abs().max()),
        "chunked_error": float((ref - chunked).abs().max()),
        "csr_equal": all(torch.equal(getattr(csr_ref, f), getattr(csr, f)) for f in _CSR_FIELDS),
    }


@pytest.fixture(scope="module")
def results() -> dict:
    return run_interpreted(__file__)


@pytest.fixture(scope="module")
def gemm_results() -> dict:
    with pytest.MonkeyPatch.context() as env:  # a second child process: each stays well under 20 s
        env.setenv("XATTENTION_CASES", "gemm")
        return run_interpreted(__file__)


@pytest.mark.parametrize("name", list(CASES))
def test_triton_selection_matches_reference_block_for_block(results, name):
    r = results[name]
    assert "error" not in r, r.get("error")
    assert r["score_error"] < 1e-5
    assert r["selection_mismatch"] == 0
    assert r["csr_equal"]
    assert 0 < r["density"] < 1


@pytest.mark.parametrize("name", list(CASES))
def test_gemm_scores_and_selection_match_reference(gemm_results, name):
    r = gemm_results[name]
    assert "error" not in r, r.get("error")
    assert r["score_error"] < 1e-5 and r["chunked_error"] < 1e-5
    assert r["csr_equal"]


if __name__ == "__main__":
    print_case_results(CASES, _run_gemm_case if os.environ.get("XATTENTION_CASES") == "gemm" else _run_case)
