"""Triton programs of the decode kernel (`fused`); importing this module imports Triton."""

from __future__ import annotations

import triton
import triton.language as tl

# Arguments that vary with the prompt (split sizes) are not specialized: a variant per divisibility pattern would
# compile at a later prompt's first call, inside its timing (`elastic_bench.kernels.hybrid.fused_kernel.LENGTHS`).


@triton.jit(do_not_specialize=["per_split", "splits", "stat_stride"])
def decode_partial(
    Q, K, V, POS, OFFSETS, SLOTS, WINDOW_START, SINK_END, PARTIAL, STATS, scale, per_split, splits, stat_stride,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    n = tl.load(SLOTS + row)
    start = split * per_split
    if start >= n:  # past the row's end (a short row of a layer split for its long rows): `combine` skips it
        return
    base = tl.load(OFFSETS + row)  # int64
    lo = tl.load(WINDOW_START + row)
    sink = tl.load(SINK_END + row)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    q = tl.load(Q + (row * G + g)[:, None] * D + d[None, :], mask=(g < G)[:, None], other=0.0)
    m_i = tl.full((G_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((G_PAD,), tl.float32)
    acc = tl.zeros((G_PAD, D), tl.float32)
    stop = tl.minimum(start + per_split, n)
    for j0 in range(start, stop, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        inside = j < stop
        pos = tl.load(POS + base + j, mask=inside, other=-1)
        visible = inside & (pos >= 0) & ((pos >= lo) | (pos < sink))
        k = tl.load(K + (base + j)[:, None] * D + d[None, :], mask=visible[:, None], other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(visible[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        v = tl.load(V + (base + j)[:, None] * D + d[None, :], mask=visible[:, None], other=0.0)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    item = (row * splits + split) * G + g
    tl.store(PARTIAL + item[:, None] * D + d[None, :], acc, mask=(g < G)[:, None])
    tl.store(STATS + item, m_i, mask=g < G)
    tl.store(STATS + stat_stride + item, l_i, mask=g < G)


@triton.jit(do_not_specialize=["per_split", "splits", "stat_stride"])
def combine(PARTIAL, STATS, OUT, SLOTS, per_split, splits, stat_stride, G: tl.constexpr, D: tl.constexpr,
            SPLITS_PAD: tl.constexpr, BLOCK_D: tl.constexpr):
    """Merge a head's split results by their log-sum-exp, ``BLOCK_D`` of its dimensions per program; splits past the
    row's slots (a short row of a layer split for its long rows) are not read."""
    head = tl.program_id(0)  # row * G + g
    row = head // G
    g = head % G
    s = tl.arange(0, SPLITS_PAD)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    item = (row * splits + s) * G + g
    m = tl.load(STATS + item, mask=s < tl.cdiv(tl.load(SLOTS + row), per_split), other=float("-inf"))
    live = m > float("-inf")  # a split that saw no visible slot adds nothing
    w = tl.where(live, tl.exp(m - tl.max(m, 0)), 0.0)
    total = tl.maximum(tl.sum(w * tl.load(STATS + stat_stride + item, mask=live, other=0.0), 0), 1e-30)
    o = tl.load(PARTIAL + item[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
    tl.store(OUT + head * D + d, (tl.sum(o * w[:, None], 0) / total).to(OUT.dtype.element_ty))


@triton.jit
def append_token(KEY, VALUE, K, V, POS, OFFSETS, NEWEST, RING, STREAMING, WINDOW_START, ring_sink, ring_span, quantum,
                 back, D: tl.constexpr, D_PAD: tl.constexpr):
    """One program per row: advance the row's newest position, write the token's key, value and position into its slot
    (a ring row past its sink: ``ring_sink + (pos - ring_sink) % ring_span``), and update the row's window start."""
    r = tl.program_id(0)
    pos = tl.load(NEWEST + r) + 1
    tl.store(NEWEST + r, pos)
    wrap = (tl.load(RING + r) != 0) & (pos >= ring_sink)
    slot = tl.load(OFFSETS + r) + tl.where(wrap, ring_sink + (pos - ring_sink) % ring_span, pos)
    d = tl.arange(0, D_PAD)
    inside = d < D
    tl.store(K + slot * D + d, tl.load(KEY + r * D + d, mask=inside), mask=inside)
    tl.store(V + slot * D + d, tl.load(VALUE + r * D + d, mask=inside), mask=inside)
    tl.store(POS + slot, pos)
    window = tl.where(tl.load(STREAMING + r) != 0, (pos // quantum - back) * quantum, 0)
    tl.store(WINDOW_START + r, window)
