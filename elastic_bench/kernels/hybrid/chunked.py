"""Chunked-prefill streaming (`StreamingGeometry.chunk_starts`) on any backend, through the backend's dense path.

A STREAMING head's queries in the chunk ``[s, e)`` see the sink, the ``local`` keys before ``s`` and the chunk up to
themselves: with ``w = max(s - local, 0)``, that is dense causal attention, aligned bottom-right, over the gathered
keys ``[0, min(sink, w)) ∪ [w, e)`` (the first chunk, ``s = 0``, gathers every key). So every chunk is one dense call
of the backend, all streaming (sample, KV head) pairs of the call batched together, and the FULL pairs are one dense
call over all keys: each head computes exactly what the chunked prefill does, and no more.

The `reference` backend does not come here: it evaluates the rule as a mask, and is the ground truth of this path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..plan import HeadPlan, Mode, StreamingGeometry

DenseFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, HeadPlan, float], torch.Tensor]


def chunked_hybrid_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: HeadPlan, scale: float, dense: DenseFn
) -> torch.Tensor:
    """Hybrid attention of a plan with a chunked streaming geometry (FULL and STREAMING heads only).

    Args:
        q: ``[B, Hq, Lq, D]``; k: ``[B, H, Lk, D]``, v: ``[B, H, Lk, Dv]``, ``Lq <= Lk`` (bottom-right alignment).
        plan: modes ``[B, H]``; ``plan.streaming.chunk_starts`` non-empty.
        scale: softmax scale.
        dense: a backend function, called with all-FULL plans on gathered ``[n, G, Lq', D]`` queries and
            ``[n, 1, Lk', D]`` keys/values (``n`` (sample, KV head) pairs, ``G = Hq // H``).

    Returns:
        ``[B, Hq, Lq, Dv]`` in ``q.dtype``.
    """
    H, Lk = k.shape[1], k.shape[2]
    G, off = q.shape[1] // H, Lk - q.shape[2]
    out = q.new_empty((*q.shape[:3], v.shape[-1]))
    streaming = (plan.modes == Mode.STREAMING).cpu()  # a synchronisation only for device modes
    for pairs, spans in ((~streaming, [(0, off, Lk)]), (streaming, plan.streaming.chunk_spans(off, Lk))):
        b_idx, h_idx = (i.to(q.device) for i in pairs.nonzero(as_tuple=True))
        if not len(b_idx):
            continue
        qg = q.unflatten(1, (H, G))[b_idx, h_idx]  # [n, G, Lq, D]
        kg, vg = k[b_idx, h_idx], v[b_idx, h_idx]  # [n, Lk, D]
        full = HeadPlan.full(len(b_idx), 1)
        rows = []
        for start, first, end in spans:
            keys, values = (_gather(t, plan.streaming, start, end).unsqueeze(1) for t in (kg, vg))
            rows.append(dense(qg[:, :, first - off : end - off], keys, values, full, scale))
        out.unflatten(1, (H, G))[b_idx, h_idx] = torch.cat(rows, dim=2)
    return out


def _gather(t: torch.Tensor, geometry: StreamingGeometry, start: int, end: int) -> torch.Tensor:
    """Keys ``[n, Lk', D]`` seen by the chunk starting at ``start`` up to position ``end - 1``: the sink, the
    ``local`` keys before the chunk and the chunk (a view when the sink and the window meet)."""
    low = max(start - geometry.local, 0)
    sink = min(geometry.sink, low)
    window = t[:, low:end]
    return torch.cat([t[:, :sink], window], dim=1) if sink else window


def check_unchunked(plan: HeadPlan) -> None:
    """Raise for a chunked streaming geometry in a backend function called directly (`hybrid_attention` runs such
    plans chunk by chunk through the backend's dense path)."""
    if plan.streaming.chunk_starts:
        raise ValueError("this backend computes no chunked streaming geometry itself; call hybrid_attention, which "
                         "runs it chunk by chunk")
