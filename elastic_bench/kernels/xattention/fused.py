"""Triton XAttention estimation: antidiagonal scoring + softmax + block sums (fused, or cuBLAS GEMM + a Triton
epilogue), and threshold selection.

Imported lazily by `elastic_bench.kernels.xattention` (importing it imports Triton), where the contract is; the PyTorch
reference is `naive`.

- Fused scoring (``triton``): one program owns ``TQ`` query tiles of ``PACK`` query heads of one GQA group
  (``PACK · TQ`` rows), so each key tile it loads serves the whole group. Phase 1 walks the causal key tiles in chunks:
  the antidiagonal sums are a GEMM with a ``S · d`` reduction (S steps of ``d``), each chunk writes its per-(row, key
  block) log-sum-exp to a scratch buffer and updates the row's running log-sum-exp; the ``[tiles, tiles]`` score
  matrix never exists. Phase 2 turns the scratch into probabilities with the final row statistics and sums each
  ``block/S`` group of rows. Programs start with the heaviest (last) query tiles.
- GEMM scoring (``gemm``): a tile is its ``S`` rows read as one row of ``S · d`` (the query tile's rows reversed), so
  the antidiagonal sums are one plain GEMM, left to cuBLAS, with the query heads of a GQA group stacked along M. The
  query tiles go in causal chunks (each against the key tiles up to its last), and a Triton epilogue reduces each
  chunk's score matrix to block scores with the same two phases. Designed for long contexts, to run the scoring GEMM
  at cuBLAS speed for the price of writing and reading the causal half of the score matrix once.
- Selection: one program per query-block row sorts the candidate scores, finds how many the mass rule takes (one
  more in upstream's first chunk, where the running sum lags), and marks them by value with ties broken by index (the
  reference's stable sort).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..hybrid.fused import LOG2E
from ..plan import BlockSelection

# Arguments that vary with the prompt (lengths) are not specialized: a variant per divisibility pattern would compile
# at a later prompt's first call, inside its timing (`elastic_bench.kernels.hybrid.fused_kernel.LENGTHS`).


@triton.jit(do_not_specialize=["Lq", "Lk", "n_tiles", "n_blocks", "n_chunks"])
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
        blse, m_i, l_i = _block_lse(tl.where(visible, acc * scale_log2, float("-inf")), m_i, l_i, M, NB, PER)
        cols = kc // PER + tl.arange(0, NB)
        tl.store(lse_rows + cols[None, :], blse, mask=t_ok[:, None] & (cols[None, :] < n_blocks))
    tl.debug_barrier()

    groups = tl.arange(0, M // PER)
    g_heads = hq0 + (groups * PER) // TQ
    g_rows = (t0 + (groups * PER) % TQ) // PER
    out_rows = Out + ((b * Hq + g_heads).to(tl.int64) * n_blocks + g_rows) * n_blocks
    _block_sums(lse_rows, out_rows, m_i, l_i, t_has_query, g_rows < n_blocks, tl.cdiv(kt_hi, PER), M, NB, PER)


@triton.jit
def _block_lse(s, m_i, l_i, M: tl.constexpr, NB: tl.constexpr, PER: tl.constexpr):
    """Phase 1 on log2 scores ``s [M, NB · PER]`` (−inf where hidden): the per-(row, key block) log2-sum-exp2
    ``[M, NB]``, and the rows' running max ``m_i`` and sum ``l_i`` ``[M]`` updated."""
    s3 = tl.reshape(s, [M, NB, PER])
    bmax = tl.max(s3, 2)
    bmax_safe = tl.where(bmax == float("-inf"), 0.0, bmax)
    bsum = tl.sum(tl.math.exp2(s3 - bmax_safe[:, :, None]), 2)
    blse = tl.where(bsum > 0, bmax_safe + tl.math.log2(tl.where(bsum > 0, bsum, 1.0)), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(bmax, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    l_i = l_i * tl.math.exp2(m_i - m_safe) + tl.sum(bsum * tl.math.exp2(bmax_safe - m_safe[:, None]), 1)
    return blse, m_new, l_i


@triton.jit
def _block_sums(lse_rows, out_rows, m_i, l_i, has_query, out_ok, kb_hi, M: tl.constexpr, NB: tl.constexpr,
                PER: tl.constexpr):
    """Phase 2: the probabilities ``exp2(blse − row lse)`` of the ``M`` rows (pointers ``lse_rows [M, 1]``; rows
    without a query count zero), summed over each group of ``PER`` rows into key blocks ``[0, kb_hi)`` of the group's
    output row (pointers ``out_rows [M / PER]``, stored where ``out_ok``)."""
    row_lse = tl.where(l_i > 0, m_i + tl.math.log2(tl.where(l_i > 0, l_i, 1.0)), 0.0)
    weight = has_query & (l_i > 0)
    for c0 in range(0, kb_hi, NB):
        cols = c0 + tl.arange(0, NB)
        blse = tl.load(lse_rows + cols[None, :], mask=weight[:, None] & (cols[None, :] < kb_hi), other=float("-inf"))
        p = tl.where(blse > float("-inf"), tl.math.exp2(blse - row_lse[:, None]), 0.0)
        block = tl.sum(tl.reshape(p, [M // PER, PER, NB]), 1)
        tl.store(out_rows[:, None] + cols[None, :], block, mask=out_ok[:, None] & (cols[None, :] < kb_hi))


@triton.jit(do_not_specialize=["t0", "t1", "n_block_rows", "n_blocks"])
def _gemm_epilogue_kernel(
    Scores, Lse, Out, Pairs,
    G, t0, t1, n_block_rows, n_blocks, scale_log2,
    PER: tl.constexpr, BLOCK_KT: tl.constexpr,
):
    """Block scores of the block rows of one causal chunk (query tiles ``[t0, t1)``), one program per (scored KV
    head, query head of its group, block row). ``Scores [pairs · G · (t1 − t0), t1]``: rows (pair, head of the group,
    query tile), columns key tiles; ``Lse`` holds the per-(row, key block) log-sum-exps between the two phases."""
    NB: tl.constexpr = BLOCK_KT // PER
    pid = tl.program_id(0)
    r = t0 // PER + pid % n_block_rows
    ig = pid // n_block_rows  # pair · G + head of the group
    bhq = tl.load(Pairs + ig // G) * G + ig % G  # (b · H + h) · G + head of the group = b · Hq + query head
    t = r * PER + tl.arange(0, PER)
    t_ok = (t >= t0) & (t < t1)
    row = ig.to(tl.int64) * (t1 - t0) + (t - t0)
    s_rows = Scores + row[:, None] * t1
    lse_rows = Lse + row[:, None] * n_blocks
    kt_hi = tl.minimum((r + 1) * PER, t1)

    m_i = tl.full([PER], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([PER], dtype=tl.float32)
    for kc in range(0, kt_hi, BLOCK_KT):
        tk = kc + tl.arange(0, BLOCK_KT)
        visible = t_ok[:, None] & (tk[None, :] <= t[:, None])
        s = tl.load(s_rows + tk[None, :], mask=visible, other=float("-inf")).to(tl.float32) * scale_log2
        blse, m_i, l_i = _block_lse(s, m_i, l_i, PER, NB, PER)
        cols = kc // PER + tl.arange(0, NB)
        tl.store(lse_rows + cols[None, :], blse, mask=t_ok[:, None] & (cols[None, :] <= r))
    tl.debug_barrier()

    out_row = Out + (bhq.to(tl.int64) * n_blocks + r) * n_blocks + tl.zeros([1], dtype=tl.int64)
    _block_sums(lse_rows, out_row, m_i, l_i, t_ok, tl.full([1], True, tl.int1), r + 1, PER, NB, PER)


@triton.jit(do_not_specialize=["n_blocks", "q_off", "Lk", "first_rows"])
def _select_kernel(Scores, Mask, Counts, Tau, Need, Hq, n_blocks, q_off, Lk, block_size, first_rows,
                   BLOCK: tl.constexpr):
    """Selection of one block row (program id = (b · Hq + query head) · nB + row), as `naive.select_blocks_naive`."""
    row = tl.program_id(0)
    r = row % n_blocks
    hq = (row // n_blocks) % Hq
    if tl.load(Need + row // n_blocks) == 0:
        return
    if ((r + 1) * block_size <= q_off) | (r * block_size >= Lk):
        return
    c = tl.arange(0, BLOCK)
    s = tl.load(Scores + row.to(tl.int64) * n_blocks + c, mask=c < n_blocks, other=0.0)
    first = (r >= 1) & (r < first_rows)
    kept = ((c == 0) | (c == r)) & (c < n_blocks)
    counted = (c == r) | ((c == 0) & (first == 0))
    cand = (c < r) & ((c > 0) | first)
    required = tl.load(Tau + hq) * tl.sum(s, 0)
    target = required - tl.sum(tl.where(counted, s, 0.0), 0)
    vals = tl.where(cand, s, -1.0)
    ordered = tl.sort(vals, descending=True)
    mass = tl.maximum(ordered, 0.0)
    before = tl.cumsum(mass, 0) - mass
    n_take = tl.sum(((ordered >= 0) & (before < target)).to(tl.int32), 0)
    lagged = tl.minimum(n_take + (required > 0).to(tl.int32), tl.sum(cand.to(tl.int32), 0))
    n_take = tl.where(first, lagged, n_take)  # the running sum lags one block: one more candidate
    last = tl.sum(tl.where(c == n_take - 1, ordered, 0.0), 0)
    above = cand & (vals > last)
    ties = cand & (vals == last)
    tie_rank = tl.cumsum(ties.to(tl.int32), 0) - ties.to(tl.int32)
    chosen = (n_take > 0) & (above | (ties & (tie_rank < n_take - tl.sum(above.to(tl.int32), 0))))
    selected = kept | chosen
    tl.store(Mask + row.to(tl.int64) * n_blocks + c, selected.to(tl.int8), mask=c < n_blocks)
    tl.store(Counts + row, tl.sum(selected.to(tl.int32), 0))


@triton.jit(do_not_specialize=["n_blocks"])
def _compact_kernel(Mask, Offsets, Indices, n_blocks, BLOCK: tl.constexpr):
    """CSR row ``pid``: the ids of the set columns of mask row ``pid``, ascending, at ``Offsets[pid]``."""
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    keep = tl.load(Mask + row.to(tl.int64) * n_blocks + c, mask=c < n_blocks, other=0).to(tl.int32)
    slot = tl.cumsum(keep, 0) - keep
    tl.store(Indices + tl.load(Offsets + row) + slot, c, mask=keep > 0)


def _pack(groups: int, tq: int) -> int:
    """Query heads of one GQA group per program: the largest power of two dividing ``groups`` that keeps the
    program's ``pack · tq`` rows within 128."""
    pack = 1
    while groups % (pack * 2) == 0 and pack * 2 * tq <= 128:
        pack *= 2
    return pack


def antidiagonal_scores_triton(
    q: torch.Tensor, k: torch.Tensor, stride: int, block_size: int, heads: torch.Tensor | None
) -> torch.Tensor:
    """Triton twin of `naive.antidiagonal_scores_naive`: ``[B, Hq, nB, nB]`` fp32."""
    from .naive import query_head_flags

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
    need = query_head_flags(heads, B, Hq, q.device).to(torch.uint8).contiguous()
    lse = torch.empty(B, Hq, n_tiles, n_blocks, dtype=torch.float32, device=q.device)
    out = torch.zeros(B, Hq, n_blocks, n_blocks, dtype=torch.float32, device=q.device)
    n_chunks = -(-n_tiles // tq)
    _scores_kernel[(B * Hq // pack, n_chunks)](
        q, k, lse, out, need,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        Hq, Hq // H, Lq, Lk, n_tiles, n_blocks, n_chunks, LOG2E / (D**0.5 * stride),
        S=stride, D=D, PER=per, PACK=pack, TQ=tq, BLOCK_KT=block_kt,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=8 if pack * tq >= 128 else 4, num_stages=3,
    )
    return out


GEMM_SCRATCH_BYTES = 1 << 30  # most bytes of one causal chunk's score matrix
GEMM_CHUNKS = 16  # causal chunks aimed at: C chunks compute (C + 1) / (2C) of the square, 1/C more than causal
GEMM_MIN_CHUNK_TILES = 256  # fewest query tiles per chunk (short inputs: fewer, larger GEMMs)


def antidiagonal_scores_gemm(
    q: torch.Tensor, k: torch.Tensor, stride: int, block_size: int, heads: torch.Tensor | None,
    chunk_tiles: int | None = None,
) -> torch.Tensor:
    """cuBLAS-GEMM twin of `naive.antidiagonal_scores_naive`: ``[B, Hq, nB, nB]`` fp32.

    Args:
        q: ``[B, Hq, Lq, D]`` queries; the GEMM runs in their dtype (fp32 accumulation, scores stored in that dtype).
        k: ``[B, H, Lk, D]`` keys, same dtype.
        stride, block_size: as `xattention.xattention_select`.
        heads: bool ``[B, H]``, KV heads to score (None: all); choosing them reads the mask on the host.
        chunk_tiles: query tiles per causal chunk, a multiple of ``block_size / stride`` (default `_chunk_tiles`).
    """
    B, Hq, Lq, D = q.shape
    H, Lk = k.shape[1], k.shape[2]
    G, S, per = Hq // H, stride, block_size // stride
    n_blocks, n_keys = -(-Lk // block_size), -(-Lk // S)
    t_lo = (Lk - Lq) // S  # the first query tile with a query; key tiles past the end (>= n_keys) are excluded
    out = torch.zeros(B, Hq, n_blocks, n_blocks, dtype=torch.float32, device=q.device)
    pairs = torch.arange(B * H, device=q.device)  # scored (b · H + h)
    if heads is not None:
        pairs = pairs[heads.to(device=q.device, dtype=torch.bool).flatten()]
    n = len(pairs)
    if n == 0 or t_lo >= n_keys:
        return out
    sel = slice(None) if heads is None else pairs
    qt = _tile_rows(q.reshape(B * H, G, Lq, D), S, (Lk - Lq) - t_lo * S, n_keys * S - Lk)  # [B·H, G, tiles, S, D]
    kt = _tile_rows(k.reshape(B * H, Lk, D)[sel], S, 0, n_keys * S - Lk).flatten(-2)  # [n, n_keys, S·D]
    c = chunk_tiles or _chunk_tiles(n_keys - t_lo, n_keys, n * G, q.element_size(), per)
    if c % per:
        raise ValueError(f"chunk_tiles ({c}) must be a multiple of block_size / stride ({per})")
    rows = n * G * min(c, n_keys - t_lo)  # most query rows of a chunk
    scratch = torch.empty(rows * n_keys, dtype=q.dtype, device=q.device)
    lse = torch.empty(rows, n_blocks, dtype=torch.float32, device=q.device)
    bounds = [t_lo, *range((t_lo // c + 1) * c, n_keys, c), n_keys]  # chunk edges on block rows
    for t0, t1 in zip(bounds, bounds[1:]):
        # query tile rows reversed, the G heads of a group stacked: [n, G · (t1 − t0), S · D]
        a = qt[sel, :, t0 - t_lo : t1 - t_lo].flip(-2).reshape(n, G * (t1 - t0), S * D)  # indexed rows: a copy
        scores = scratch[: a.shape[1] * n * t1].view(n, a.shape[1], t1)
        scores.baddbmm_(a, kt[:, :t1].transpose(1, 2), beta=0.0, alpha=1.0 / (D**0.5 * S))
        n_block_rows = (t1 - 1) // per - t0 // per + 1
        _gemm_epilogue_kernel[(n * G * n_block_rows,)](
            scores, lse, out, pairs, G, t0, t1, n_block_rows, n_blocks, LOG2E,
            PER=per, BLOCK_KT=max(per, 512), num_warps=4,
        )
    return out


def _tile_rows(x: torch.Tensor, stride: int, front: int, back: int) -> torch.Tensor:
    """``x [..., L, D]`` zero-padded by ``front`` positions before and ``back`` after, as tiles
    ``[..., (front + L + back) / stride, stride, D]`` (a view where no padding is needed and ``x``'s rows allow it)."""
    if front or back:
        x = torch.nn.functional.pad(x, (0, 0, front, back))
    return x.reshape(*x.shape[:-2], -1, stride, x.shape[-1])


def _chunk_tiles(n_query_tiles: int, n_key_tiles: int, rows_per_tile: int, itemsize: int, per: int) -> int:
    """Query tiles per causal chunk: about ``1 / GEMM_CHUNKS`` of the query tiles (at least ``GEMM_MIN_CHUNK_TILES``),
    fewer where a chunk's ``[rows_per_tile · c, n_key_tiles]`` scores would pass ``GEMM_SCRATCH_BYTES``; a multiple
    of ``per`` (block rows never straddle chunks)."""
    c = max(GEMM_MIN_CHUNK_TILES, -(-n_query_tiles // GEMM_CHUNKS))
    c = min(c, GEMM_SCRATCH_BYTES // (rows_per_tile * n_key_tiles * itemsize))
    return max(per, c // per * per)


def select_blocks_triton(
    scores: torch.Tensor, tau: torch.Tensor, need: torch.Tensor, q_len: int, k_len: int, block_size: int,
    first_rows: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `naive.select_blocks_naive` (same arguments): (bool mask ``[B, Hq, nB, nB]``, int32 row counts
    ``[B, Hq, nB]``)."""
    B, Hq, nB, _ = scores.shape
    mask = torch.zeros(B, Hq, nB, nB, dtype=torch.int8, device=scores.device)
    counts = torch.zeros(B, Hq, nB, dtype=torch.int32, device=scores.device)
    _select_kernel[(B * Hq * nB,)](
        scores.contiguous(), mask, counts, tau, need.to(torch.uint8).contiguous(), Hq, nB, k_len - q_len, k_len,
        block_size, first_rows, BLOCK=_row_block(nB), num_warps=4,
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
