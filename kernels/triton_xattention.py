"""Triton XAttention estimation: fused antidiagonal scoring + softmax + block sums, and threshold selection.

Imported lazily by `xattention` (importing it imports Triton); the contract and the PyTorch reference are there.

- Scoring: one program owns ``TQ`` query tiles of ``PACK`` query heads of one GQA group (``PACK · TQ`` rows), so each
  key tile it loads serves the whole group. Phase 1 walks the causal key tiles in chunks: the antidiagonal sums are a
  GEMM with a ``S · d`` reduction (S steps of ``d``), each chunk writes its per-(row, key block) log-sum-exp to a
  scratch buffer and updates the row's running log-sum-exp; the ``[tiles, tiles]`` score matrix never exists. Phase 2
  turns the scratch into probabilities with the final row statistics and sums each ``block/S`` group of rows. Programs
  start with the heaviest (last) query tiles.
- Selection: one program per query-block row sorts the candidate scores, finds how many the mass rule takes, and
  marks them by value with ties broken by index (the reference's stable sort).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .plan import BlockSelection


@triton.jit
def _scores_kernel(
    Q, K, Lse, Out, Need,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    Hq, G, Lq, Lk, n_tiles, n_blocks, n_chunks, scale_log2,
    S: tl.constexpr, D: tl.constexpr, PER: tl.constexpr, PACK: tl.constexpr, TQ: tl.constexpr,
    BLOCK_KT: tl.constexpr, PRECISION: tl.constexpr,
):
    M: tl.constexpr = PACK * TQ
    NB: tl.constexpr = BLOCK_KT // PER
    packs = Hq // PACK
    b = tl.program_id(0) // packs
    hq0 = (tl.program_id(0) % packs) * PACK
    if tl.load(Need + b * Hq + hq0) == 0:
        return
    t0 = (n_chunks - 1 - tl.program_id(1)) * TQ
    q_off = Lk - Lq

    offs_m = tl.arange(0, M)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_KT)
    heads = hq0 + offs_m // TQ
    t = t0 + offs_m % TQ
    t_ok = t < n_tiles
    t_has_query = ((t + 1) * S > q_off) & (t * S < Lk)
    q_base = Q + b.to(tl.int64) * stride_qb + heads.to(tl.int64)[:, None] * stride_qh + offs_d[None, :]
    k_base = K + b.to(tl.int64) * stride_kb + (hq0 // G).to(tl.int64) * stride_kh + offs_d[:, None]
    lse_rows = Lse + ((b * Hq + heads).to(tl.int64) * n_tiles + t)[:, None] * n_blocks
    kt_hi = tl.minimum(t0 + TQ, tl.cdiv(Lk, S))

    m_i = tl.full([M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([M], dtype=tl.float32)
    for kc in range(0, kt_hi, BLOCK_KT):
        acc = tl.zeros([M, BLOCK_KT], dtype=tl.float32)
        tk = kc + offs_n
        for u in range(S):
            qpos = t * S + (S - 1 - u)
            q_ok = (qpos >= q_off) & (qpos < Lk)
            qu = tl.load(q_base + (qpos - q_off).to(tl.int64)[:, None] * stride_qm, mask=q_ok[:, None], other=0.0)
            kpos = tk * S + u
            ku = tl.load(k_base + kpos.to(tl.int64)[None, :] * stride_kn, mask=kpos[None, :] < Lk, other=0.0)
            acc = tl.dot(qu, ku, acc, input_precision=PRECISION)
        visible = (tk[None, :] <= t[:, None]) & (tk[None, :] * S < Lk)
        s = tl.where(visible, acc * scale_log2, float("-inf"))
        s3 = tl.reshape(s, [M, NB, PER])
        bmax = tl.max(s3, 2)
        bmax_safe = tl.where(bmax == float("-inf"), 0.0, bmax)
        bsum = tl.sum(tl.math.exp2(s3 - bmax_safe[:, :, None]), 2)
        blse = tl.where(bsum > 0, bmax_safe + tl.math.log2(tl.where(bsum > 0, bsum, 1.0)), float("-inf"))
        cols = kc // PER + tl.arange(0, NB)
        tl.store(lse_rows + cols[None, :], blse, mask=t_ok[:, None] & (cols[None, :] < n_blocks))
        m_new = tl.maximum(m_i, tl.max(bmax, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.math.exp2(m_i - m_safe) + tl.sum(bsum * tl.math.exp2(bmax_safe - m_safe[:, None]), 1)
        m_i = m_new
    tl.debug_barrier()

    row_lse = tl.where(l_i > 0, m_i + tl.math.log2(tl.where(l_i > 0, l_i, 1.0)), 0.0)
    weight = t_has_query & (l_i > 0)
    kb_hi = tl.cdiv(kt_hi, PER)
    G_ROWS: tl.constexpr = M // PER
    groups = tl.arange(0, G_ROWS)
    g_heads = hq0 + (groups * PER) // TQ
    g_rows = (t0 + (groups * PER) % TQ) // PER
    g_ok = g_rows < n_blocks
    out_rows = Out + ((b * Hq + g_heads).to(tl.int64) * n_blocks + g_rows)[:, None] * n_blocks
    for c0 in range(0, kb_hi, NB):
        cols = c0 + tl.arange(0, NB)
        blse = tl.load(lse_rows + cols[None, :], mask=t_ok[:, None] & (cols[None, :] < kb_hi), other=float("-inf"))
        p = tl.where(weight[:, None] & (blse > float("-inf")), tl.math.exp2(blse - row_lse[:, None]), 0.0)
        block = tl.sum(tl.reshape(p, [G_ROWS, PER, NB]), 1)
        tl.store(out_rows + cols[None, :], block, mask=g_ok[:, None] & (cols[None, :] < kb_hi))


@triton.jit
def _select_kernel(Scores, Mask, Counts, Tau, Need, Hq, n_blocks, q_off, Lk, block_size, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    r = row % n_blocks
    hq = (row // n_blocks) % Hq
    if tl.load(Need + row // n_blocks) == 0:
        return
    if ((r + 1) * block_size <= q_off) | (r * block_size >= Lk):
        return
    c = tl.arange(0, BLOCK)
    s = tl.load(Scores + row.to(tl.int64) * n_blocks + c, mask=c < n_blocks, other=0.0)
    forced = ((c == 0) | (c == r)) & (c < n_blocks)
    cand = (c > 0) & (c < r)
    target = tl.load(Tau + hq) * tl.sum(s, 0) - tl.sum(tl.where(forced, s, 0.0), 0)
    vals = tl.where(cand, s, -1.0)
    ordered = tl.sort(vals, descending=True)
    mass = tl.maximum(ordered, 0.0)
    before = tl.cumsum(mass, 0) - mass
    n_take = tl.sum(((ordered >= 0) & (before < target)).to(tl.int32), 0)
    last = tl.sum(tl.where(c == n_take - 1, ordered, 0.0), 0)
    above = cand & (vals > last)
    ties = cand & (vals == last)
    tie_rank = tl.cumsum(ties.to(tl.int32), 0) - ties.to(tl.int32)
    chosen = (n_take > 0) & (above | (ties & (tie_rank < n_take - tl.sum(above.to(tl.int32), 0))))
    selected = (forced | chosen) & (c < n_blocks)
    tl.store(Mask + row.to(tl.int64) * n_blocks + c, selected.to(tl.int8), mask=c < n_blocks)
    tl.store(Counts + row, tl.sum(selected.to(tl.int32), 0))


@triton.jit
def _compact_kernel(Mask, Offsets, Indices, n_blocks, BLOCK: tl.constexpr):
    """CSR row ``pid``: the ids of the set columns of mask row ``pid``, ascending, at ``Offsets[pid]``."""
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    keep = tl.load(Mask + row.to(tl.int64) * n_blocks + c, mask=c < n_blocks, other=0).to(tl.int32)
    slot = tl.cumsum(keep, 0) - keep
    tl.store(Indices + tl.load(Offsets + row) + slot, c, mask=keep > 0)


def _pack(groups: int, tq: int) -> int:
    pack = 1
    while groups % (pack * 2) == 0 and pack * 2 * tq <= 128:
        pack *= 2
    return pack


def antidiagonal_scores_triton(
    q: torch.Tensor, k: torch.Tensor, stride: int, block_size: int, heads: torch.Tensor | None
) -> torch.Tensor:
    """Triton twin of `xattention._scores_reference`: ``[B, Hq, nB, nB]`` fp32."""
    from .xattention import _heads

    B, Hq, Lq, D = q.shape
    H, Lk = k.shape[1], k.shape[2]
    if D & (D - 1) or D < 16:
        raise ValueError(f"Triton XAttention scoring needs a power-of-two head_dim >= 16, got {D}")
    q, k = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k))
    per = block_size // stride
    n_blocks = -(-Lk // block_size)
    n_tiles = n_blocks * per
    tq = max(per, 32)
    pack = _pack(Hq // H, tq)
    block_kt = max(per, 128)
    need = _heads(heads, B, Hq, q.device).to(torch.uint8).contiguous()
    lse = torch.empty(B, Hq, n_tiles, n_blocks, dtype=torch.float32, device=q.device)
    out = torch.zeros(B, Hq, n_blocks, n_blocks, dtype=torch.float32, device=q.device)
    n_chunks = -(-n_tiles // tq)
    _scores_kernel[(B * Hq // pack, n_chunks)](
        q, k, lse, out, need,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        Hq, Hq // H, Lq, Lk, n_tiles, n_blocks, n_chunks, 1.4426950408889634 / (D**0.5 * stride),
        S=stride, D=D, PER=per, PACK=pack, TQ=tq, BLOCK_KT=block_kt,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=8 if pack * tq >= 128 else 4, num_stages=3,
    )
    return out


def select_blocks_triton(
    scores: torch.Tensor, tau: torch.Tensor, need: torch.Tensor, q_len: int, k_len: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `xattention._select_reference`: (bool mask ``[B, Hq, nB, nB]``, int32 row counts
    ``[B, Hq, nB]``)."""
    B, Hq, nB, _ = scores.shape
    mask = torch.zeros(B, Hq, nB, nB, dtype=torch.int8, device=scores.device)
    counts = torch.zeros(B, Hq, nB, dtype=torch.int32, device=scores.device)
    _select_kernel[(B * Hq * nB,)](
        scores.contiguous(), mask, counts, tau, need.to(torch.uint8).contiguous(), Hq, nB, k_len - q_len, k_len,
        block_size, BLOCK=_row_block(nB), num_warps=4,
    )
    return mask.view(torch.bool), counts


def csr_from_mask_triton(mask: torch.Tensor, counts: torch.Tensor) -> BlockSelection:
    """`BlockSelection` of a bool mask ``[B, Hq, nB, nB]`` whose row counts are known: one small host read (nnz)."""
    B, Hq, nB, _ = mask.shape
    flat = counts.flatten().to(torch.int64)
    offsets = torch.cumsum(flat, 0) - flat
    indices = torch.empty(int(flat.sum()), dtype=torch.int32, device=mask.device)
    _compact_kernel[(B * Hq * nB,)](mask.view(torch.int8), offsets, indices, nB, BLOCK=_row_block(nB), num_warps=4)
    return BlockSelection(counts, offsets.view(B, Hq, nB), indices)


def _row_block(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())
