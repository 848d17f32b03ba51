"""XAttention block selection: antidiagonal scoring and threshold selection, output as a `BlockSelection`.

XAttention (Xu et al., ICML 2025, https://arxiv.org/abs/2503.16428), as specified in `reference/baselines.md` §4 and
`reference/method.md` §6. Written from the specification; no upstream code.

Design decisions:
- Positions are absolute (bottom-right alignment when ``Lq < Lk``): query tile ``t`` covers positions
  ``[t·S, (t+1)·S)``; tiles are zero-padded where they reach before the first query or past the last key, key tiles
  past the end are excluded, and query tiles without a query contribute nothing.
- Scoring ("inverse" antidiagonal, stride S): ``score[t_q, t_k] = Σ_u q[t_q·S + S-1-u] · k[t_k·S + u] / (√d · S)``
  on the causal tile grid (``t_k <= t_q``), fp32 softmax over the key tiles of each query tile, summed into
  ``block_size / S`` square groups: block scores ``[B, Hq, nB, nB]``, ``nB = ceil(Lk / block_size)``.
- Selection per query-block row ``r``: block 0 and the diagonal block ``r`` are always kept and count toward the
  target ``τ · Σ_c score[r, c]``; blocks ``0 < c < r`` are added by descending score (ties: lower index first) while
  the mass accumulated *before* adding one is below the target, so the crossing block is included.
- Three implementations with one contract: plain PyTorch (``backend="reference"``, the ground truth), fused Triton
  (``backend="triton"``, `triton_xattention`), which never materialises the tile-score matrix, and cuBLAS GEMMs over
  causal chunks of that matrix with a Triton epilogue (``backend="gemm"``; it rounds the tile scores to the input
  dtype before the softmax, so near-tie blocks can flip). ``auto`` takes the faster on the H200 (`docs/benchmarks.md`):
  ``triton`` below `GEMM_MIN_KEYS` keys, ``gemm`` from there. Both GPU backends share the Triton selection.
- Only the KV heads marked in ``heads`` (e.g. the BLOCK_SPARSE heads of a plan) are scored; other rows stay empty.
"""

from __future__ import annotations

import torch

from .plan import BlockSelection
from .triton_hybrid import available as triton_available

GEMM_MIN_KEYS = 65536  # from here `auto` scores with cuBLAS (H200: Triton faster up to 48K, GEMMs from 64K)


def xattention_select(
    q: torch.Tensor,
    k: torch.Tensor,
    threshold: float | torch.Tensor = 0.9,
    stride: int = 16,
    block_size: int = 128,
    heads: torch.Tensor | None = None,
    backend: str = "auto",
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

    Returns:
        `BlockSelection` with rows ``[B, Hq, ceil(Lk / block_size)]``, for `HeadPlan.blocks`.
    """
    scores = antidiagonal_scores(q, k, stride, block_size, heads, backend)
    B, Hq, Lq, _ = q.shape
    tau, need = _tau(threshold, Hq, q.device), _heads(heads, B, Hq, q.device)
    if _backend(backend, q.device) != "reference":
        from .triton_xattention import csr_from_mask_triton, select_blocks_triton

        return csr_from_mask_triton(*select_blocks_triton(scores, tau, need, Lq, k.shape[2], block_size))
    return BlockSelection.from_dense(_select_reference(scores, tau, need, Lq, k.shape[2], block_size))


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
        from .triton_xattention import antidiagonal_scores_triton

        return antidiagonal_scores_triton(q, k, stride, block_size, heads)
    if backend == "gemm":
        from .triton_xattention import antidiagonal_scores_gemm

        return antidiagonal_scores_gemm(q, k, stride, block_size, heads)
    return _scores_reference(q, k, stride, block_size, heads)


def select_blocks(
    scores: torch.Tensor,
    threshold: float | torch.Tensor,
    q_len: int,
    k_len: int,
    block_size: int = 128,
    heads: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Threshold selection on block scores ``[B, Hq, nB, nB]`` → bool mask ``[B, Hq, nB, nB]`` (see module doc;
    ``gemm`` selects as ``triton``)."""
    B, Hq, nB, _ = scores.shape
    tau, need = _tau(threshold, Hq, scores.device), _heads(heads, B, Hq, scores.device)
    if _backend(backend, scores.device) != "reference":
        from .triton_xattention import select_blocks_triton

        return select_blocks_triton(scores, tau, need, q_len, k_len, block_size)[0]
    return _select_reference(scores, tau, need, q_len, k_len, block_size)


def _tau(threshold: float | torch.Tensor, num_query_heads: int, device) -> torch.Tensor:
    return torch.as_tensor(threshold, dtype=torch.float32, device=device).expand(num_query_heads).contiguous()


def _heads(heads: torch.Tensor | None, B: int, Hq: int, device) -> torch.Tensor:
    """Per-KV-head flags ``[B, H]`` expanded to query heads ``[B, Hq]`` (bool)."""
    if heads is None:
        return torch.ones(B, Hq, dtype=torch.bool, device=device)
    return heads.to(device=device, dtype=torch.bool).repeat_interleave(Hq // heads.shape[1], dim=1)


def _rows_with_queries(q_len: int, k_len: int, block_size: int, device) -> torch.Tensor:
    r = torch.arange(-(-k_len // block_size), device=device)
    return ((r + 1) * block_size > k_len - q_len) & (r * block_size < k_len)


def _scores_reference(
    q: torch.Tensor, k: torch.Tensor, stride: int, block_size: int, heads: torch.Tensor | None, chunk_blocks: int = 16
) -> torch.Tensor:
    B, Hq, Lq, D = q.shape
    H, Lk = k.shape[1], k.shape[2]
    G, S, per = Hq // H, stride, block_size // stride
    nB = -(-Lk // block_size)
    n_t = nB * per
    need = _heads(heads, B, Hq, q.device)
    kp = torch.zeros(B, H, nB * block_size, D, device=q.device)
    kp[:, :, :Lk] = k.float()
    qp = torch.zeros(B, Hq, nB * block_size, D, device=q.device)
    qp[:, :, Lk - Lq : Lk] = q.float()
    kt = kp.view(B, H, n_t, S * D)
    qt = qp.view(B, Hq, n_t, S, D).flip(3).reshape(B, Hq, n_t, S * D)
    t = torch.arange(n_t, device=q.device)
    t_has_query = ((t + 1) * S > Lk - Lq) & (t * S < Lk)
    k_ok = t * S < Lk
    out = torch.zeros(B, Hq, nB, nB, device=q.device)
    scale = 1.0 / (D**0.5 * S)
    for b in range(B):
        for hq in range(Hq):
            if not bool(need[b, hq]):
                continue
            for r0 in range(0, nB, chunk_blocks):
                rows = slice(r0 * per, min(r0 + chunk_blocks, nB) * per)
                s = (qt[b, hq, rows] @ kt[b, hq // G].T) * scale  # [c, n_t]
                visible = (t[None, :] <= t[rows, None]) & k_ok[None, :]
                p = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1) * t_has_query[rows, None]
                out[b, hq, r0 : r0 + p.shape[0] // per] = p.view(-1, per, nB, per).sum((1, 3))
    return out


def _select_reference(
    scores: torch.Tensor, tau: torch.Tensor, need: torch.Tensor, q_len: int, k_len: int, block_size: int
) -> torch.Tensor:
    B, Hq, nB, _ = scores.shape
    r = torch.arange(nB, device=scores.device)[:, None]
    c = torch.arange(nB, device=scores.device)[None, :]
    forced = (c == 0) | (c == r)
    cand = (c > 0) & (c < r)
    target = tau[None, :, None] * scores.sum(-1) - (scores * forced).sum(-1)  # [B, Hq, nB]
    vals = torch.where(cand, scores, -1.0)
    ordered, order = vals.sort(dim=-1, descending=True, stable=True)
    mass = ordered.clamp(min=0)
    before = torch.cumsum(mass, -1) - mass
    take = (ordered >= 0) & (before < target[..., None])
    selected = torch.zeros_like(take).scatter_(-1, order, take) | forced
    rows = need[:, :, None] & _rows_with_queries(q_len, k_len, block_size, scores.device)[None, None, :]
    return selected & rows[..., None]
