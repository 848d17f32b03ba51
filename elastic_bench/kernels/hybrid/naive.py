"""Plain-PyTorch hybrid attention: the ground truth for every other backend (``backend="reference"``).

One KV head (with its G query heads) at a time, in fp32. A FULL head of a one-shot prefill is causal
``scaled_dot_product_attention``; every other head (a chunked-prefill STREAMING head included: the predicate is the
rule of `StreamingGeometry` itself) gets an explicit boolean mask built from the `masks` predicates,
chunked over queries so that a 32K-token prompt fits in CPU memory. A chunk only reads the keys its predicate can
reach (up to its last query; for STREAMING heads the sink and the window), so sparse heads also cost less here.
Differentiable, so CPU router training runs through it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..plan import HeadPlan, Mode
from . import masks


def naive_hybrid_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: HeadPlan, scale: float, chunk_size: int = 1024
) -> torch.Tensor:
    """Reference hybrid attention.

    Args:
        q: ``[B, Hq, Lq, D]`` queries (post-RoPE).
        k, v: ``[B, H, Lk, D]`` keys, ``[B, H, Lk, Dv]`` values, ``Hq % H == 0``, ``Lq <= Lk`` (bottom-right causal
            alignment).
        plan: modes ``[B, H]`` and geometry; see `HeadPlan`.
        scale: softmax scale.
        chunk_size: queries per masked chunk.

    Returns:
        ``[B, Hq, Lq, Dv]`` in ``q.dtype``. A query whose block-sparse row selects no visible key outputs zeros.
    """
    B, Hq, Lq, D = q.shape
    H, Lk = k.shape[1], k.shape[2]
    G = Hq // H
    bs = plan.block_size
    kv_pos = torch.arange(Lk, device=q.device)
    modes = plan.modes.tolist()
    dense_blocks = plan.blocks.to_dense(-(-Lk // bs)).to(q.device) if plan.has(Mode.BLOCK_SPARSE) else None
    rows = []
    for b in range(B):
        for h in range(H):
            mode = Mode(modes[b][h])
            qh = q[b : b + 1, h * G : (h + 1) * G].float()  # [1, G, Lq, D] (4-D: SDPA's fused CPU kernels)
            kh, vh = (x[b : b + 1, h : h + 1].float().expand(1, G, Lk, x.shape[-1]) for x in (k, v))
            if mode == Mode.FULL and Lq in (Lk, 1):  # plain causal prefill, or a decode step that sees every key
                rows.append(F.scaled_dot_product_attention(qh, kh, vh, is_causal=Lq > 1, scale=scale))
                continue
            if mode == Mode.BLOCK_SPARSE:
                preds = [masks.block_sparse(dense_blocks[b, hq], bs) for hq in range(h * G, (h + 1) * G)]
            else:
                preds = [masks.for_mode(mode, plan.streaming, bs)]
            chunks = []
            for start in range(0, Lq, chunk_size):
                stop = min(start + chunk_size, Lq)
                q_pos = torch.arange(Lk - Lq + start, Lk - Lq + stop, device=q.device)
                keys = kv_pos[reachable(mode, plan, int(q_pos[0]), int(q_pos[-1]))]
                allowed = torch.stack([p(q_pos[:, None], keys[None, :]) for p in preds])  # [G or 1, c, keys]
                out = F.scaled_dot_product_attention(
                    qh[:, :, start:stop], kh[:, :, keys], vh[:, :, keys], attn_mask=allowed, scale=scale
                )
                chunks.append(out.nan_to_num(0.0))  # a query with no visible key outputs zeros
            rows.append(torch.cat(chunks, dim=2))
    return torch.cat(rows, dim=1).view(B, Hq, Lq, v.shape[-1]).to(q.dtype)


def reachable(mode: Mode, plan: HeadPlan, first: int, last: int) -> torch.Tensor:
    """Indices ``[n]`` of the keys that queries at positions ``first..last`` can see under ``mode`` (window starts
    never decrease with the position, so the first query's is the lowest)."""
    if mode != Mode.STREAMING:
        return torch.arange(last + 1)
    geometry, bs = plan.streaming, plan.block_size
    sink, low = geometry.sink_end(bs), max(0, int(geometry.window_start(torch.tensor(first), bs)))
    return torch.cat([torch.arange(min(sink, low)), torch.arange(low, last + 1)])
