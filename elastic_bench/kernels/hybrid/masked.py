"""Hybrid attention through PyTorch's `scaled_dot_product_attention` over gathered key blocks (``backend="masked"``):
the CPU path, whose cost for any plan is at most that of dense causal attention.

Design decisions:
- Work is cut into *rows*: the call's queries in one absolute query block (``p // block_size``; the first and the last
  row may be partial). A row attends only the key blocks some of its queries see, gathered into one key tensor. So a
  row computes at most its blocks up to the diagonal, which is what dense causal attention computes for it, and a
  sparse row much less; no ``[Lq, Lk]`` mask is ever built.
- A row's gathered blocks are listed wholly visible first (every query sees every key: no mask) and partially visible
  last (the diagonal, a window's edge, a partial sink block), where the `masks` predicate gives an additive mask. Masks
  are 4-D floats, which keeps PyTorch on its fused CPU flash kernel (a 3-D mask sends SDPA to its math path, which
  materialises every score, and a boolean one is converted on every call).
- Rows with the same block counts are batched into one SDPA call: one call per distinct (blocks, wholly visible
  blocks, row shape), not per row or head.
- FULL and STREAMING heads see the same key blocks in every (sample, KV head) pair: one gather serves them all (the
  pairs' query heads are the call's heads, GQA-style, and the rows its batch) and each row's mask is broadcast over
  the heads. BLOCK_SPARSE rows are per query head, so each (pair, query head, row) is one batch item with its own
  selected blocks; the items of one call share one mask, since only the diagonal block is partial and the row shape
  is part of the call's key.
- A one-shot prefill's FULL heads are one causal SDPA call (dense attention itself), a single query's one unmasked
  call. Every other shape goes through rows, so chunks of queries (``Lq < Lk``) keep the same bound.
- fp32 arithmetic, as `reference`, and differentiable; the output is in ``q.dtype``. The gathered keys of one call
  are capped (`MAX_GATHERED`), so long prompts run in several calls rather than one large copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..plan import HeadPlan, Mode, StreamingGeometry
from . import masks
from .chunked import check_unchunked

MAX_GATHERED = 1 << 24  # gathered key (and value) elements per SDPA call: 64 MiB each in fp32


def masked_hybrid_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: HeadPlan, scale: float
) -> torch.Tensor:
    """Hybrid attention by SDPA over each query row's gathered key blocks (``backend="masked"``).

    Args:
        q: ``[B, Hq, Lq, D]`` queries (post-RoPE).
        k, v: ``[B, H, Lk, D]`` keys, ``[B, H, Lk, Dv]`` values, ``Hq % H == 0``, ``Lq <= Lk`` (bottom-right causal
            alignment).
        plan: modes ``[B, H]`` and geometry (unchunked; `hybrid_attention` runs chunked geometries chunk by chunk).
        scale: softmax scale.

    Returns:
        ``[B, Hq, Lq, Dv]`` in ``q.dtype``. A query whose block-sparse row selects no visible key outputs zeros.
    """
    check_unchunked(plan)
    B, Hq, Lq, D = q.shape
    H, Lk, Dv = k.shape[1], k.shape[2], v.shape[-1]
    G = Hq // H
    rows = _Rows.of(Lq, Lk, plan.block_size, q.device)
    modes = plan.modes.cpu()  # a synchronisation only for device modes
    groups = [(mode, (modes == mode).nonzero(as_tuple=True)) for mode in Mode]
    groups = [(mode, tuple(i.to(q.device) for i in pairs)) for mode, pairs in groups if len(pairs[0])]
    whole = len(groups) == 1  # one mode: its pairs are all pairs, taken as views of the inputs
    out = None if whole else q.new_empty((B, H, G, Lq, Dv), dtype=torch.float32)
    for mode, pairs in groups:
        qg = q.float().reshape(B * H, G, Lq, D) if whole else q.unflatten(1, (H, G))[pairs].float()  # [n, G, Lq, D]
        kg, vg = (t.float().flatten(0, 1) if whole else t[pairs].float() for t in (k, v))  # [n, Lk, D]
        res = _attend(mode, qg, kg, vg, plan, pairs, rows, scale)
        if whole:
            return res.reshape(B, Hq, Lq, Dv).to(q.dtype)
        out[pairs] = res
    return out.view(B, Hq, Lq, Dv).to(q.dtype)


def _attend(mode: Mode, qg, kg, vg, plan: HeadPlan, pairs, rows: _Rows, scale: float) -> torch.Tensor:
    """The ``n`` (sample, KV head) ``pairs`` of one mode: ``qg [n, G, Lq, D]``, ``kg [n, Lk, D]``, ``vg [n, Lk, Dv]``
    → ``[n, G, Lq, Dv]``."""
    n, G, Lq, _ = qg.shape
    if mode == Mode.FULL and Lq in (rows.keys, 1):
        return F.scaled_dot_product_attention(qg, kg[:, None], vg[:, None], is_causal=Lq > 1, scale=scale,
                                              enable_gqa=True)
    if mode == Mode.BLOCK_SPARSE:
        table = plan.blocks.to_dense(rows.key_blocks).to(qg.device)[:, :, rows.ids]  # [B, Hq, nR, nK]
        table = table.unflatten(1, (-1, G))[pairs] & rows.blocks()[0]  # [n, G, nR, nK], causal
        return _per_head_rows(qg, kg, vg, table, rows, scale)
    return _shared_rows(qg, kg, vg, plan.streaming if mode == Mode.STREAMING else None, rows, scale)


@dataclass(frozen=True)
class _Rows:
    """The call's query rows: absolute query blocks ``ids [nR]``, their first call-relative query ``start [nR]`` and
    query count ``length [nR]``; ``offset = Lk - Lq``, ``keys = Lk``."""

    ids: torch.Tensor
    start: torch.Tensor
    length: torch.Tensor
    offset: int
    keys: int
    block_size: int

    @classmethod
    def of(cls, Lq: int, Lk: int, block_size: int, device) -> _Rows:
        offset = Lk - Lq
        ids = torch.arange(offset // block_size, -(-Lk // block_size), device=device)
        first = torch.clamp(ids * block_size, min=offset)
        stop = torch.clamp((ids + 1) * block_size, max=Lk)
        return cls(ids, first - offset, stop - first, offset, Lk, block_size)

    @property
    def key_blocks(self) -> int:
        return -(-self.keys // self.block_size)

    def blocks(self, streaming: StreamingGeometry | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Bool ``(some, every)``, each ``[nR, nK]``: the key blocks in which some query of the row sees some key, and
        those whose every key every query of the row sees, under the causal rule (FULL) or ``streaming``'s."""
        bs = self.block_size
        first = self.start + self.offset  # absolute position of each row's first query
        last = first + self.length - 1
        k0 = torch.arange(self.key_blocks, device=self.ids.device) * bs
        k1 = k0 + bs - 1  # past Lk in a partial last block, which is thus never wholly visible: its tail is padding
        some, every = k0 <= last[:, None], k1 <= first[:, None]
        if streaming is not None:  # window starts never decrease with the position
            sink = streaming.sink_end(bs)
            some &= (k0 < sink) | (k1 >= streaming.window_start(first, bs)[:, None])
            every &= (k1 < sink) | (k0 >= streaming.window_start(last, bs)[:, None])
        return some, every

    def query_index(self, rows: torch.Tensor, length: int) -> torch.Tensor:
        """Call-relative query indices ``[m, length]`` of the rows ``rows [m]``."""
        return self.start[rows, None] + torch.arange(length, device=self.ids.device)

    def key_positions(self, blocks: torch.Tensor) -> torch.Tensor:
        """Absolute key positions ``[m, c·bs]`` of the key blocks ``[m, c]`` (past ``Lk`` in a partial last block)."""
        return (blocks[..., None] * self.block_size + torch.arange(self.block_size, device=blocks.device)).flatten(-2)


def _shared_rows(qg, kg, vg, streaming: StreamingGeometry | None, rows: _Rows, scale: float) -> torch.Tensor:
    """FULL heads (``streaming`` None) or STREAMING ones, whose rows see the same key blocks in every pair.
    ``qg [n, G, Lq, D]``, ``kg [n, Lk, D]``, ``vg [n, Lk, Dv]`` → ``[n, G, Lq, Dv]``."""
    n, G, Lq, D = qg.shape
    out = qg.new_empty((n, G, Lq, vg.shape[-1]))
    predicate = masks.causal() if streaming is None else masks.streaming(streaming, rows.block_size)
    counts, wholly, order = _listed(*rows.blocks(streaming))
    for (count, full, length), members in _calls(counts, wholly, rows.length, per_block=n * rows.block_size * D):
        m = len(members)
        kpos = rows.key_positions(order[members, :count])  # [m, c·bs]
        qidx = rows.query_index(members, length).flatten()  # [m·length]
        mask = _mask(predicate, qidx.view(m, length) + rows.offset, kpos, full, rows.block_size)
        queries = qg.index_select(2, qidx).unflatten(2, (m, length)).permute(2, 0, 1, 3, 4).flatten(1, 2)
        keys, values = (t.index_select(1, _clamped(kpos, rows)).unflatten(1, (m, -1)).transpose(0, 1) for t in (kg, vg))
        # queries [m, n·G, length, D], keys/values [m, n, c·bs, D], mask [m, 1, length, c·bs] or None
        res = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)
        out.index_copy_(2, qidx, res.unflatten(1, (n, G)).permute(1, 2, 0, 3, 4).flatten(2, 3))
    return out


def _per_head_rows(qg, kg, vg, table: torch.Tensor, rows: _Rows, scale: float) -> torch.Tensor:
    """BLOCK_SPARSE heads: query head ``g`` of pair ``i`` in row ``r`` sees the key blocks ``table[i, g, r]`` (none
    above the diagonal), causal inside the diagonal one. ``qg [n, G, Lq, D]``, ``kg [n, Lk, D]``, ``vg [n, Lk, Dv]``,
    ``table [n, G, nR, nK]`` → ``[n, G, Lq, Dv]``; rows that select nothing are zeros."""
    n, G, Lq, D = qg.shape
    Lk, shape, Dv = kg.shape[1], table.shape[:3], vg.shape[-1]
    flat_q, flat_k, flat_v = (t.reshape(-1, t.shape[-1]) for t in (qg, kg, vg))  # [n·G·Lq, D], [n·Lk, D or Dv]
    out = qg.new_zeros((n, G, Lq, Dv))
    counts, wholly, order = _listed(table, table & rows.blocks()[1])
    within = rows.start + rows.offset - rows.ids * rows.block_size  # each row's first query's place in its block
    keys = (wholly, within.expand(shape), rows.length.expand(shape))
    for (count, full, _, length), items in _calls(counts, *keys, per_block=rows.block_size * D):
        i, g, r = torch.unravel_index(items, shape)  # [m] each
        kpos = rows.key_positions(order[i, g, r, :count])  # [m, c·bs]
        qidx = rows.query_index(r, length)  # [m, length]
        # Every item of the call has its partial block (if any) on its diagonal, at the same place: one mask.
        mask = _mask(masks.causal(), qidx[:1] + rows.offset, kpos[:1], full, rows.block_size)
        qrows = ((i * G + g)[:, None] * Lq + qidx).flatten()
        krows = (i[:, None] * Lk + _clamped(kpos, rows).view(kpos.shape)).flatten()
        queries = flat_q.index_select(0, qrows).view(-1, 1, length, D)  # [m, 1, length, D]
        keys, values = (t.index_select(0, krows).view(-1, 1, count * rows.block_size, t.shape[-1])
                        for t in (flat_k, flat_v))
        res = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale)
        out.view(-1, Dv).index_copy_(0, qrows, res.view(-1, Dv))
    return out


def _listed(some: torch.Tensor, every: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block tables ``[..., nK]`` (``every`` within ``some``) as lists: (blocks seen ``[...]``, wholly visible ones
    ``[...]``, block ids ``[..., nK]``: the wholly visible ones, then the partially visible ones, then the rest)."""
    rank = some.to(torch.uint8) + every.to(torch.uint8)
    return some.sum(-1), every.sum(-1), torch.argsort(rank, dim=-1, descending=True, stable=True)


def _mask(predicate: masks.MaskFn, qpos: torch.Tensor, kpos: torch.Tensor, full: int, bs: int) -> torch.Tensor | None:
    """Additive mask ``[m, 1, length, c·bs]`` of queries at ``qpos [m, length]`` over keys at ``kpos [m, c·bs]``: 0
    over the first ``full`` (wholly visible) blocks, the predicate's ``0`` / ``-inf`` over the others; None if all are
    wholly visible."""
    if full * bs == kpos.shape[1]:
        return None
    mask = torch.zeros(qpos.shape[0], 1, qpos.shape[1], kpos.shape[1], device=qpos.device)
    seen = predicate(qpos[:, :, None], kpos[:, None, full * bs :])
    mask[:, 0, :, full * bs :].masked_fill_(~seen, float("-inf"))
    return mask


def _clamped(kpos: torch.Tensor, rows: _Rows) -> torch.Tensor:
    """``kpos`` flattened, keys past ``Lk`` read as the last key (the predicate masks them: they follow every query)."""
    return kpos.clamp(max=rows.keys - 1).flatten()


def _calls(counts: torch.Tensor, *keys: torch.Tensor, per_block: int) -> Iterator[tuple[list[int], torch.Tensor]]:
    """The SDPA calls over items (the flattened elements of ``counts`` and ``keys``, all of one shape): items that
    see ``count > 0`` key blocks and agree in ``counts`` and every key, in parts whose gathered keys (``count ·
    per_block`` elements per item) stay within `MAX_GATHERED`. Yields ``([count, *key values], item indices [m])``."""
    stacked = torch.stack([t.flatten().long() for t in (counts, *keys)], dim=1)
    distinct, inverse = torch.unique(stacked, dim=0, return_inverse=True)
    for j, values in enumerate(distinct.tolist()):
        if values[0]:
            members = (inverse == j).nonzero()[:, 0]
            yield from ((values, part) for part in members.split(max(1, MAX_GATHERED // (values[0] * per_block))))
