"""XAttention block selection: antidiagonal scoring and threshold selection, output as a `BlockSelection`.

XAttention (Xu et al., ICML 2025, https://arxiv.org/abs/2503.16428; upstream mit-han-lab/x-attention,
``xattn/src/Xattention.py``), written from the paper and a reading of that code; none of it is copied.

Design decisions:
- Positions are absolute (bottom-right alignment when ``Lq < Lk``): query tile ``t`` covers positions
  ``[t·S, (t+1)·S)``; tiles are zero-padded where they reach before the first query or past the last key, key tiles
  past the end are excluded, and query tiles without a query contribute nothing.
- Scoring ("inverse" antidiagonal, stride S): ``score[t_q, t_k] = Σ_u q[t_q·S + S-1-u] · k[t_k·S + u] / (√d · S)``
  on the causal tile grid (``t_k <= t_q``), fp32 softmax over the key tiles of each query tile, summed into
  ``block_size / S`` square groups: block scores ``[B, Hq, nB, nB]``, ``nB = ceil(Lk / block_size)``.
- Selection per absolute query-block row ``r`` with target ``R = τ · Σ_c score[r, c]``: the output always holds
  block 0 and the diagonal block ``r``, never a block above the diagonal; candidates are taken by descending score
  (ties: lower index first). Two rules (``rule``):
  - ``"strict"``: blocks 0 and ``r`` count toward ``R``; candidates ``0 < c < r`` are added while the mass
    accumulated *before* adding one is below ``R``, so the crossing block is included.
  - ``"upstream"`` (default): upstream's ``find_blocks_chunked`` as ``Xattention_prefill`` calls it (causal,
    ``keep_sink`` / ``keep_recent`` off, automatic chunk size). It is the strict rule except in the rows
    ``1 <= r < C / block_size`` of the first estimation chunk (``C`` = `upstream_chunk_size` of ``Lk``: every row up
    to 16K keys, the first 8192 tokens above 16K up to 32K). There upstream forces column 0, then writes the diagonal
    "eye" over the chunk's columns ``[0, C / block_size)``, which clears column 0 again; and its running sum assumes
    two forced blocks. Hence in those rows:
    (a) only the diagonal counts toward ``R`` up front; block 0 is an ordinary candidate (``0 <= c < r``), yet it is
    always in the output (upstream writes every slot it does not take into column 0);
    (b) the running sum lags one block: the ``j``-th candidate is compared with the diagonal plus the first ``j - 2``
    candidates (the first candidate with 0), so one candidate more than the strict count is taken whenever ``R > 0``
    (capped at the row's candidates: upstream's pick beyond them is a zero-score block above the diagonal, which its
    causal crop removes).
  Row 0 is ``{0}`` and τ = 0 leaves block 0 and the diagonal under both rules. Upstream sums in float64, we in
  float32: a row whose running sum meets ``R`` within rounding may differ by its crossing block.
- Chunked prefill (``Lq < Lk``): upstream's estimate aligns a query chunk to key-chunk boundaries; here rows stay at
  their absolute positions (bottom-right) and each is selected as in a one-shot prefill of the ``Lk`` keys (the
  first-chunk rows from the chunk size of ``Lk``), so a chunk starting on a block boundary gets the one-shot rows.
- Three implementations with one contract: plain PyTorch (``backend="reference"``, the ground truth), fused Triton
  (``backend="triton"``, `fused`), which never materialises the tile-score matrix, and cuBLAS GEMMs over
  causal chunks of that matrix with a Triton epilogue (``backend="gemm"``; it rounds the tile scores to the input
  dtype before the softmax, so near-tie blocks can flip). ``auto`` takes the faster on the H200 (`docs/benchmarks.md`):
  ``triton`` below `GEMM_MIN_KEYS` keys, ``gemm`` from there. Both GPU backends share the Triton selection.
- Only the KV heads marked in ``heads`` (e.g. the BLOCK_SPARSE heads of a plan) are scored; other rows stay empty.
"""

from __future__ import annotations

import torch

from ..plan import BlockSelection
from ..timing import part
from ..triton_available import triton_available
from .naive import (
    RULES,
    Rule,
    antidiagonal_scores_naive,
    first_chunk_rows,
    query_head_flags,
    select_blocks_naive,
    thresholds,
    upstream_chunk_size,
)

__all__ = ["GEMM_MIN_KEYS", "RULES", "Rule", "antidiagonal_scores", "select_blocks", "upstream_chunk_size",
           "xattention_select"]

GEMM_MIN_KEYS = 65536  # from here `auto` scores with cuBLAS (H200: Triton faster up to 48K, GEMMs from 64K)


def xattention_select(
    q: torch.Tensor,
    k: torch.Tensor,
    threshold: float | torch.Tensor = 0.9,
    stride: int = 16,
    block_size: int = 128,
    heads: torch.Tensor | None = None,
    backend: str = "auto",
    rule: Rule = "upstream",
) -> BlockSelection:
    """Select key blocks per (sample, query head, query block) with XAttention.

    Args:
        q: ``[B, Hq, Lq, D]`` post-RoPE queries (the queries of this call, at absolute positions ``Lk - Lq + i``).
        k: ``[B, H, Lk, D]`` post-RoPE keys, not repeated for GQA.
        threshold: τ, a float or a per-query-head tensor ``[Hq]``.
        stride: antidiagonal stride S (8 or 16; must divide ``block_size``).
        block_size: block size of the selection (128 as Block-Sparse-Attention).
        heads: bool ``[B, H]``: KV heads to score (all when None); the rows of other heads are empty.
        backend: ``"auto"`` (on CUDA ``triton`` below `GEMM_MIN_KEYS` keys, ``gemm`` from there; else reference),
            ``"triton"``, ``"gemm"`` or ``"reference"``.
        rule: selection rule, ``"upstream"`` (upstream's, first estimation chunk included) or ``"strict"``.

    Returns:
        `BlockSelection` with rows ``[B, Hq, ceil(Lk / block_size)]``, for `HeadPlan.blocks`.
    """
    B, Hq, Lq, _ = q.shape
    Lk = k.shape[2]
    first = first_chunk_rows(rule, Lk, block_size)
    fused = _backend(backend, q.device) != "reference"
    with part("estimation"):
        scores = antidiagonal_scores(q, k, stride, block_size, heads, backend)
        tau, need = thresholds(threshold, Hq, q.device), query_head_flags(heads, B, Hq, q.device)
        if fused:
            from .fused import csr_from_mask_triton, select_blocks_triton

            selected = select_blocks_triton(scores, tau, need, Lq, Lk, block_size, first)
        else:
            selected = select_blocks_naive(scores, tau, need, Lq, Lk, block_size, first)
    with part("planning"):
        return csr_from_mask_triton(*selected) if fused else BlockSelection.from_dense(selected)


def _backend(backend: str, device: torch.device, k_len: int = 0) -> str:
    if backend == "auto":
        if not (triton_available(device) and device.type == "cuda"):
            return "reference"
        return "gemm" if k_len >= GEMM_MIN_KEYS else "triton"
    if backend not in ("triton", "gemm", "reference"):
        raise ValueError(f"XAttention backend must be auto, triton, gemm or reference; got {backend!r}")
    if backend != "reference" and not triton_available(device):
        raise RuntimeError(f"Triton is not available on {device} (set TRITON_INTERPRET=1 to run it on the CPU)")
    return backend


def _check(q: torch.Tensor, k: torch.Tensor, stride: int, block_size: int) -> None:
    if q.dim() != 4 or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[1] % k.shape[1]:
        raise ValueError(f"expected q [B, Hq, Lq, D] and k [B, H, Lk, D]; got {tuple(q.shape)}, {tuple(k.shape)}")
    if q.shape[2] > k.shape[2]:
        raise ValueError(f"more queries ({q.shape[2]}) than keys ({k.shape[2]})")
    if stride < 1 or block_size % stride:
        raise ValueError(f"the stride ({stride}) must divide the block size ({block_size})")


def antidiagonal_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    stride: int = 16,
    block_size: int = 128,
    heads: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Normalised antidiagonal block scores ``[B, Hq, nB, nB]`` (fp32; each scored row sums to its query tiles' count).

    Shapes as `xattention_select`; rows of unscored heads and rows without queries are zero.
    """
    _check(q, k, stride, block_size)
    backend = _backend(backend, q.device, k.shape[2])
    if backend == "triton":
        from .fused import antidiagonal_scores_triton

        return antidiagonal_scores_triton(q, k, stride, block_size, heads)
    if backend == "gemm":
        from .fused import antidiagonal_scores_gemm

        return antidiagonal_scores_gemm(q, k, stride, block_size, heads)
    return antidiagonal_scores_naive(q, k, stride, block_size, heads)


def select_blocks(
    scores: torch.Tensor,
    threshold: float | torch.Tensor,
    q_len: int,
    k_len: int,
    block_size: int = 128,
    heads: torch.Tensor | None = None,
    backend: str = "auto",
    rule: Rule = "upstream",
) -> torch.Tensor:
    """Threshold selection on block scores ``[B, Hq, nB, nB]`` → bool mask ``[B, Hq, nB, nB]`` (see module doc;
    ``gemm`` selects as ``triton``; other arguments as `xattention_select`)."""
    B, Hq, nB, _ = scores.shape
    first = first_chunk_rows(rule, k_len, block_size)
    tau, need = thresholds(threshold, Hq, scores.device), query_head_flags(heads, B, Hq, scores.device)
    if _backend(backend, scores.device) != "reference":
        from .fused import select_blocks_triton

        return select_blocks_triton(scores, tau, need, q_len, k_len, block_size, first)[0]
    return select_blocks_naive(scores, tau, need, q_len, k_len, block_size, first)
