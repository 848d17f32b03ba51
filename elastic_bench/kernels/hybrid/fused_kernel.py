"""The Triton program behind ``backend="triton"``: one launch computes every head of a layer, whatever its mode.

Imported lazily by `fused` (importing it imports Triton). One program computes one work item, a tile of
``BLOCK_M`` query rows against one KV head, heaviest (last) tiles first:
- FULL and STREAMING heads decide per KV head, so a tile packs ``PACK`` query heads of one GQA group
  (``BLOCK_M // PACK`` positions each) and every K/V tile it loads serves all of them;
- BLOCK_SPARSE selections are per query head, so their tiles hold ``BLOCK_M`` positions of one query head.

The key range of a tile is covered by three loops over ``BLOCK_N`` key blocks, any of which may be empty: the fully
visible sink blocks and the window interior (one loop, so a streaming tile fills one software pipeline, not two), the
CSR-listed blocks below the diagonal, and the masked blocks (the partial sink block, the window's ragged start and
the diagonal, again in one loop). Only the masked loop evaluates the mask; FULL is STREAMING with no sink and an
unbounded window. A token-granular streaming tile far enough from the sink instead anchors its window blocks at its
last key and covers the few keys below them in ``SMALL_N``-key masked blocks (a fourth loop), so it computes the
window plus its own positions rounded up to ``SMALL_N`` keys, not to ``BLOCK_N``. Softmax is online in fp32 with
``exp2`` and log2(e) folded into the scale; masked logits get a finite -1e6 so a fully masked block cannot produce
NaN. Base offsets are int64. On Hopper, K/V tiles come through TMA tensor descriptors over ``[B, H, Lk, D]`` (zero
fill past the end); elsewhere through pointer arithmetic.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Integer arguments that vary with the prompt's length. Triton would otherwise compile a variant for each pattern of
# their divisibility by 16 at its first call (seconds), which a warm-up on one prompt does not cover: a later prompt's
# timed prefill would include it. They bound loops and masks only, so leaving them unspecialized costs nothing.
LENGTHS = ["B", "Lq", "Lk", "n_tiles", "first_tile", "n_rows"]


@triton.jit
def _attend(
    acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, k_desc, v_desc, b, h, lo, hi, lo2, hi2, lo3, hi3,
    shift, shift2, block_ids, sub_blocks, block_size, pos, win_start, sink_end, Lk, qk_scale,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr, GATHER: tl.constexpr, MASK: tl.constexpr,
    PRECISION: tl.constexpr, USE_TMA: tl.constexpr, STAGES: tl.constexpr = None,
):
    """Online-softmax update of one tile over key blocks ``lo..hi``, ``lo2..hi2`` then ``lo3..hi3`` (``BLOCK_N`` keys
    each), in one loop: one software pipeline, not one per range.

    ``GATHER``: block ``j`` is sub-block ``j % sub_blocks`` of plan block ``block_ids[j // sub_blocks]``; otherwise it
    starts at key ``j * BLOCK_N`` plus its range's ``shift`` (``shift2``; the third range has none). ``MASK``: apply
    causality, the sink and the per-row window start ``win_start``.
    ``USE_TMA``: K/V tiles come through tensor descriptors over ``[B, H, Lk, D]`` (zero-filled past ``Lk``).
    ``STAGES``: the loop's software-pipelining depth (None: the launch's ``num_stages``).
    """
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    n1 = hi - lo
    n12 = n1 + hi2 - lo2
    for i in tl.range(0, n12 + hi3 - lo3, num_stages=STAGES):
        j = tl.where(i < n1, lo + i, tl.where(i < n12, lo2 + i - n1, lo3 + i - n12))
        if GATHER:
            blk = tl.load(block_ids + j // sub_blocks)
            start = blk * block_size + (j % sub_blocks) * BLOCK_N
        else:
            start = j * BLOCK_N + tl.where(i < n1, shift, tl.where(i < n12, shift2, 0))
        kpos = start + offs_n
        k_ptrs = k_base + start.to(tl.int64) * stride_kn + offs_n[None, :] * stride_kn + offs_d[:, None]
        v_ptrs = v_base + start.to(tl.int64) * stride_vn + offs_n[:, None] * stride_vn + offs_d[None, :]
        if USE_TMA:
            k = tl.reshape(k_desc.load([b, h, start, 0]), [BLOCK_N, D]).T
        elif MASK:
            k = tl.load(k_ptrs, mask=(kpos[None, :] < Lk) & d_ok[:, None], other=0.0)
        elif D == D_PAD:
            k = tl.load(k_ptrs)
        else:
            k = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
        qk = tl.dot(q, k, input_precision=PRECISION)
        if MASK:
            seen = (kpos[None, :] < sink_end) | (kpos[None, :] >= win_start[:, None])
            keep = (kpos[None, :] <= pos[:, None]) & seen
            qk = qk * qk_scale + tl.where(keep, 0.0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        m_i = m_ij
        if USE_TMA:
            v = tl.reshape(v_desc.load([b, h, start, 0]), [BLOCK_N, D])
        elif MASK:
            v = tl.load(v_ptrs, mask=(kpos[:, None] < Lk) & d_ok[None, :], other=0.0)
        elif D == D_PAD:
            v = tl.load(v_ptrs)
        else:
            v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
    return acc, m_i, l_i


@triton.jit(do_not_specialize=LENGTHS)
def hybrid_fwd(
    Q, K, V, Out, K_desc, V_desc, Modes, Counts, Offsets, Indices,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
    B, Hq, H, G, Lq, Lk, n_tiles, first_tile, n_rows, block_size,
    stream_sink_end, stream_quantum, stream_back, qk_scale,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PACK: tl.constexpr,
    SMALL_N: tl.constexpr, PRECISION: tl.constexpr, USE_TMA: tl.constexpr, SKIP_MODE: tl.constexpr,
    GATHER_STAGES: tl.constexpr = None,
):
    """One work item: program ``pid`` takes query tile ``n_tiles - 1 - pid // (B·Hq)`` (heaviest first: a causal tile's
    work grows with its position) of sample ``pid // Hq % B`` and query head ``pid % Hq``; the heads of one tile are
    adjacent in launch order, so they share K/V tiles in L2. Items of mode ``SKIP_MODE`` return at once. The
    block-list loop pipelines ``GATHER_STAGES`` deep (None: ``num_stages``; see `TileConfig.gather_stages`).

    Streaming window start of a row at absolute position ``p``: ``(p // stream_quantum - stream_back) *
    stream_quantum`` (token geometry: quantum 1, back ``local - 1``; block geometry: quantum ``block_size``, back
    ``local_blocks - 1``); keys below ``stream_sink_end`` are always visible.
    """
    pid = tl.program_id(0)
    hq = pid % Hq
    b = (pid // Hq) % B
    tile = n_tiles - 1 - pid // (Hq * B)
    h = hq // G
    mode = tl.load(Modes + b * H + h).to(tl.int32)
    if mode == SKIP_MODE:
        return
    sparse = mode == 2
    streaming = mode == 1

    # Rows of this item: PACK heads x rph positions (packed) or one head x BLOCK_M positions (block-sparse).
    rph = tl.where(sparse, BLOCK_M, BLOCK_M // PACK)
    sub = tl.where(sparse, 0, hq % PACK)
    head0 = hq - sub
    pos0 = (first_tile + tile) * BLOCK_M + sub * rph
    q_off = Lk - Lq
    p_first = tl.maximum(pos0, q_off)
    p_last = tl.minimum(pos0 + rph, Lk) - 1
    if p_last < p_first:
        return

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    pos = pos0 + offs_m % rph
    heads = head0 + offs_m // rph
    row_ok = (pos >= q_off) & (pos < Lk)
    q_rows = (pos - q_off).to(tl.int64)
    q_ptrs = Q + b.to(tl.int64) * stride_qb + heads.to(tl.int64)[:, None] * stride_qh \
        + q_rows[:, None] * stride_qm + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    k_base = K + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh

    # Mode geometry: sink end and window start (FULL and BLOCK_SPARSE: no sink, unbounded window).
    sink_end = tl.where(streaming, stream_sink_end, 0)
    quantum = tl.where(streaming, stream_quantum, 1)
    back = tl.where(streaming, stream_back, Lk)
    win_start = (pos // quantum - back) * quantum
    w_lo = tl.maximum((p_first // quantum - back) * quantum, 0)
    w_hi = tl.maximum((p_last // quantum - back) * quantum, 0)

    # Stage bounds in BLOCK_N key blocks (see the module docstring).
    diag_lo = p_first // BLOCK_N
    diag_hi = p_last // BLOCK_N + 1
    sink_hi = tl.minimum(tl.cdiv(sink_end, BLOCK_N), w_lo // BLOCK_N)
    sink_full = tl.minimum(tl.minimum(sink_end // BLOCK_N, (p_first + 1) // BLOCK_N), sink_hi)
    edge_lo = w_lo // BLOCK_N
    edge_hi = tl.minimum(tl.cdiv(w_hi, BLOCK_N), diag_lo)
    inner_hi = tl.where(sparse, edge_hi, diag_lo)

    # Block-sparse rows: CSR entries below the diagonal block, and whether the diagonal block is listed.
    sub_blocks = block_size // BLOCK_N
    row = (b * Hq + hq).to(tl.int64) * n_rows + pos0 // block_size
    count = tl.load(Counts + row, mask=sparse, other=0)
    row_start = tl.load(Offsets + row, mask=sparse, other=0)
    n_below = 0
    n_diag = 0
    scan = tl.arange(0, 128)
    diag_block = pos0 // block_size
    for c0 in range(0, count, 128):
        ids = tl.load(Indices + row_start + c0 + scan, mask=c0 + scan < count, other=-1)
        n_below += tl.sum(((ids >= 0) & (ids < diag_block)).to(tl.int32))
        n_diag += tl.sum((ids == diag_block).to(tl.int32))
    diag_lo = tl.where(sparse, diag_block * sub_blocks, diag_lo)
    diag_hi = tl.where(sparse & (n_diag == 0), diag_lo, diag_hi)

    # Token-granular streaming tiles anchor their window at the tile's last key instead of at key block bounds:
    # ``n_win`` blocks end at ``p_last`` (the last ``n_causal`` of them on the diagonal, masked), and the few keys below
    # them that the tile's first rows still see come in ``SMALL_N``-key masked blocks. A tile of ``rph`` positions then
    # computes ``local + rph - 1`` window keys rounded up to ``SMALL_N``, not to ``BLOCK_N``. Only where the anchored
    # blocks stay above the sink blocks; other tiles keep the aligned ranges.
    n_win = (back + 1) // BLOCK_N
    n_causal = tl.cdiv(p_last - p_first + 1, BLOCK_N)
    lowest = p_last + 1 - n_win * BLOCK_N
    n_small = tl.cdiv(tl.maximum(lowest - w_lo, 0), SMALL_N)
    small_lo = lowest - n_small * SMALL_N
    anchor = streaming & (SMALL_N < BLOCK_N) & (quantum == 1) & (n_win >= n_causal) \
        & (small_lo >= tl.cdiv(sink_end, BLOCK_N) * BLOCK_N)
    win_lo = tl.where(anchor, 0, edge_hi)
    win_hi = tl.where(anchor, n_win - n_causal, inner_hi)
    mask_lo = tl.where(anchor, n_win - n_causal, edge_lo)
    mask_hi = tl.where(anchor, n_win, edge_hi)
    win_shift = tl.where(anchor, lowest, 0)
    diag_lo = tl.where(anchor, 0, diag_lo)
    diag_hi = tl.where(anchor, 0, diag_hi)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    ids_ptr = Indices + row_start
    if sparse:  # block-list loop only (a block-sparse tile has no sink or window range)
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, K_desc, V_desc, b, h,
                                0, n_below * sub_blocks, 0, 0, 0, 0, 0, 0, ids_ptr, sub_blocks, block_size, pos,
                                win_start, sink_end, Lk, qk_scale, D, D_PAD, BLOCK_N, True, False, PRECISION, USE_TMA,
                                GATHER_STAGES)
    else:
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, K_desc, V_desc, b, h,
                                0, sink_full, win_lo, win_hi, 0, 0, 0, win_shift, ids_ptr, sub_blocks, block_size,
                                pos, win_start, sink_end, Lk, qk_scale, D, D_PAD, BLOCK_N, False, False, PRECISION,
                                USE_TMA)
    # The masked blocks in one loop: the partial sink block and the window's ragged start (empty for FULL and
    # BLOCK_SPARSE tiles), then the diagonal; for an anchored tile, its diagonal blocks and then its small blocks.
    acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, K_desc, V_desc, b, h,
                            sink_full, sink_hi, mask_lo, mask_hi, diag_lo, diag_hi, 0, win_shift, ids_ptr,
                            sub_blocks, block_size, pos, win_start, sink_end, Lk, qk_scale, D, D_PAD, BLOCK_N, False,
                            True, PRECISION, USE_TMA)
    if SMALL_N < BLOCK_N:
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_base, v_base, stride_kn, stride_vn, K_desc, V_desc, b, h,
                                0, tl.where(anchor, n_small, 0), 0, 0, 0, 0, small_lo, 0, ids_ptr, sub_blocks,
                                block_size, pos, win_start, sink_end, Lk, qk_scale, D, D_PAD, SMALL_N, False, True,
                                PRECISION, False)

    out = tl.where(l_i[:, None] > 0, acc / tl.where(l_i > 0, l_i, 1.0)[:, None], 0.0)
    o_ptrs = Out + b.to(tl.int64) * stride_ob + heads.to(tl.int64)[:, None] * stride_oh \
        + q_rows[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < D))
