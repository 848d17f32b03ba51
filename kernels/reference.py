"""Plain-PyTorch hybrid attention: the ground truth for every other backend.

Chunked over queries so a 32K-token prompt fits in CPU memory: one chunk materialises ``[G, chunk, Lk]`` fp32 scores
for the G query heads of one KV head. Accumulation is in fp32; the output takes the input dtype.
"""

from __future__ import annotations

import torch

from . import masks
from .plan import HeadPlan, Mode


def naive_hybrid_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: HeadPlan, scale: float, chunk_size: int = 512
) -> torch.Tensor:
    """Reference hybrid attention.

    Args:
        q: ``[B, Hq, Lq, D]`` queries (post-RoPE).
        k, v: ``[B, H, Lk, D]`` keys/values, ``Hq % H == 0``, ``Lq <= Lk`` (bottom-right causal alignment).
        plan: modes ``[B, H]`` and geometry; see `HeadPlan`.
        scale: softmax scale.
        chunk_size: queries per chunk.

    Returns:
        ``[B, Hq, Lq, D]`` in ``q.dtype``. A query whose block-sparse row selects no visible key outputs zeros.
    """
    B, Hq, Lq, _ = q.shape
    H, Lk = k.shape[1], k.shape[2]
    G = Hq // H
    bs = plan.block_size
    n_key_blocks = -(-Lk // bs)
    out = torch.empty_like(q)
    kv_pos = torch.arange(Lk, device=q.device)
    modes = plan.modes.tolist()
    dense_blocks = plan.blocks.to_dense(n_key_blocks) if plan.has(Mode.BLOCK_SPARSE) else None
    for b in range(B):
        for h in range(H):
            mode = Mode(modes[b][h])
            heads = slice(h * G, (h + 1) * G)
            kf, vf = k[b, h].float(), v[b, h].float()
            if mode == Mode.BLOCK_SPARSE:
                preds = [masks.block_sparse(dense_blocks[b, hq], bs) for hq in range(h * G, (h + 1) * G)]
            else:
                preds = [masks.for_mode(mode, plan.streaming, bs)]
            for start in range(0, Lq, chunk_size):
                stop = min(start + chunk_size, Lq)
                q_pos = torch.arange(Lk - Lq + start, Lk - Lq + stop, device=q.device)
                allowed = torch.stack([p(q_pos[:, None], kv_pos[None, :]) for p in preds])  # [G or 1, c, Lk]
                scores = (q[b, heads, start:stop].float() @ kf.T) * scale  # [G, c, Lk]
                scores = scores.masked_fill(~allowed, float("-inf"))
                probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a query with no selected key outputs zeros
                out[b, heads, start:stop] = (probs @ vf).to(q.dtype)
    return out
