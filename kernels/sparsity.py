"""Exact (query, key) pair counts of a HeadPlan: the raw material of ΩESR.

Definitions follow `reference/method.md` §7: ``A(h)`` is the number of causal pairs a head actually computes (for a
KV head whose G query heads have different block masks, the mean over those query heads); ``C`` is the number of
causal pairs, ``C = Σ_i (p_i + 1)`` with ``p_i = Lk - Lq + i``. ``ρ(h) = 1 - A(h)/C``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from .plan import HeadPlan, Mode, StreamingGeometry


@dataclass(frozen=True)
class PairCounts:
    """Pair counts of one plan.

    Attributes:
        attended: float64 ``[B, H]``: pairs computed per KV head (mean over the head's query heads).
        causal: causal pairs ``C`` of the call.
        attended_last: float64 ``[B, H]``: keys seen by the last query (for ``esr_mode="last_row"``).
        causal_last: keys visible to the last query under dense causal attention (``Lk``).
    """

    attended: torch.Tensor
    causal: int
    attended_last: torch.Tensor
    causal_last: int


def causal_pairs(q_len: int, k_len: int) -> int:
    """``Σ_i (Lk - Lq + i + 1)`` for ``i < Lq``."""
    return q_len * (k_len - q_len) + q_len * (q_len + 1) // 2


@lru_cache(maxsize=256)
def streaming_pairs(q_len: int, k_len: int, geometry: StreamingGeometry, block_size: int) -> tuple[int, int]:
    """(pairs, keys seen by the last query) of one STREAMING head."""
    p = torch.arange(k_len - q_len, k_len, dtype=torch.int64)
    if geometry.granularity == "token":
        n = torch.clamp(p + 1, max=geometry.sink + geometry.local)
    else:
        sink_blocks, local_blocks = geometry.blocks(block_size)
        r = p // block_size
        w0 = torch.clamp(r - local_blocks + 1, min=0)
        n = torch.where(w0 <= sink_blocks, p + 1, sink_blocks * block_size + p - w0 * block_size + 1)
    return int(n.sum()), int(n[-1]) if q_len else 0


def _block_sparse_pairs(plan: HeadPlan, q_len: int, k_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query head ``[B, Hq]`` (pairs, keys seen by the last query) of the block selection."""
    sel, bs = plan.blocks, plan.block_size
    B, Hq, nQ = sel.shape
    device = sel.counts.device
    p = torch.arange(k_len - q_len, k_len, device=device)
    rows = p // bs
    q_per_row = torch.bincount(rows, minlength=nQ).to(torch.float64)[:nQ]
    diag_per_row = torch.bincount(rows, weights=(p - rows * bs + 1).to(torch.float64), minlength=nQ)[:nQ]
    entry_row = torch.repeat_interleave(torch.arange(B * Hq * nQ, device=device), sel.counts.flatten().long())
    r, c = entry_row % nQ, sel.indices.long()
    below = (c < r).to(torch.float64)
    on_diag = c == r
    contrib = below * q_per_row[r] * bs + on_diag * diag_per_row[r]
    attended = torch.zeros(B * Hq, dtype=torch.float64, device=device).index_add_(0, entry_row // nQ, contrib)
    last, r_last = k_len - 1, (k_len - 1) // bs
    in_last = (r == r_last).to(torch.float64)
    contrib_last = in_last * (below * bs + on_diag * (last - r_last * bs + 1))
    attended_last = torch.zeros(B * Hq, dtype=torch.float64, device=device).index_add_(0, entry_row // nQ, contrib_last)
    return attended.view(B, Hq), attended_last.view(B, Hq)


def pair_counts(plan: HeadPlan, q_len: int, k_len: int, num_query_heads: int) -> PairCounts:
    """Exact attended-pair counts of ``plan`` for a call with ``q_len`` queries over ``k_len`` keys."""
    B, H = plan.modes.shape
    G = num_query_heads // H
    modes = plan.modes.long()
    total = causal_pairs(q_len, k_len)
    attended = torch.full((B, H), float(total), dtype=torch.float64, device=modes.device)
    attended_last = torch.full((B, H), float(k_len if q_len else 0), dtype=torch.float64, device=modes.device)
    if plan.has(Mode.STREAMING):
        pairs, last = streaming_pairs(q_len, k_len, plan.streaming, plan.block_size)
        attended = torch.where(modes == Mode.STREAMING, float(pairs), attended)
        attended_last = torch.where(modes == Mode.STREAMING, float(last), attended_last)
    if plan.has(Mode.BLOCK_SPARSE):
        sparse, sparse_last = _block_sparse_pairs(plan, q_len, k_len)
        is_sparse = modes == Mode.BLOCK_SPARSE
        attended = torch.where(is_sparse, sparse.view(B, H, G).mean(-1), attended)
        attended_last = torch.where(is_sparse, sparse_last.view(B, H, G).mean(-1), attended_last)
    return PairCounts(attended, total, attended_last, k_len)
