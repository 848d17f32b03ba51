"""Learned attention sinks (gpt-oss, https://arxiv.org/abs/2508.10925): one logit per query head that joins every
softmax denominator without a key or a value.

With ``Z`` the sum of a query's exponentiated scores over the keys it attends and ``s`` its head's sink, the output is
``Σ e^{s_j} v_j / (Z + e^s) = out · Z / (Z + e^s) = out · sigmoid(lse - s)``, ``lse = log Z``: the output any backend
computes without the sink, scaled per query. `plan_logsumexp` gives ``lse`` for any plan in plain PyTorch (the
plan's own `masks` predicates, chunked over queries, only the keys a chunk can reach), so the sinks do not depend on
the backend; it costs about one more pass of the scores (no values).
"""

from __future__ import annotations

import torch

from ..plan import HeadPlan, Mode
from . import masks
from .naive import reachable


def plan_logsumexp(q: torch.Tensor, k: torch.Tensor, plan: HeadPlan, scale: float, chunk_size: int = 1024
                   ) -> torch.Tensor:
    """The log-sum-exp of each query's scaled scores over the keys ``plan`` has it attend.

    Args:
        q: ``[B, Hq, Lq, D]`` queries; k: ``[B, H, Lk, D]`` keys (bottom-right causal alignment, as `hybrid_attention`).
        plan: modes ``[B, H]`` and geometry.
        scale: softmax scale.
        chunk_size: queries per chunk.

    Returns:
        float32 ``[B, Hq, Lq]``; ``-inf`` for a query that attends no key.
    """
    B, Hq, Lq, _ = q.shape
    H, Lk = k.shape[1], k.shape[2]
    G, bs = Hq // H, plan.block_size
    kv_pos = torch.arange(Lk, device=q.device)
    modes = plan.modes.tolist()
    dense_blocks = plan.blocks.to_dense(-(-Lk // bs)).to(q.device) if plan.has(Mode.BLOCK_SPARSE) else None
    out = torch.empty(B, Hq, Lq, dtype=torch.float32, device=q.device)
    for b in range(B):
        for h in range(H):
            mode = Mode(modes[b][h])
            heads = slice(h * G, (h + 1) * G)
            if mode == Mode.BLOCK_SPARSE:
                preds = [masks.block_sparse(dense_blocks[b, hq], bs) for hq in range(h * G, (h + 1) * G)]
            else:
                preds = [masks.for_mode(mode, plan.streaming, bs)]
            for start in range(0, Lq, chunk_size):
                stop = min(start + chunk_size, Lq)
                q_pos = torch.arange(Lk - Lq + start, Lk - Lq + stop, device=q.device)
                keys = kv_pos[reachable(mode, plan, int(q_pos[0]), int(q_pos[-1])).to(q.device)]
                allowed = torch.stack([p(q_pos[:, None], keys[None, :]) for p in preds])  # [G or 1, c, n]
                scores = q[b, heads, start:stop].float() @ k[b, h, keys].float().T * scale  # [G, c, n]
                out[b, heads, start:stop] = scores.masked_fill(~allowed, float("-inf")).logsumexp(-1)
    return out


def with_sinks(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, plan: HeadPlan, scale: float,
               sinks: torch.Tensor) -> torch.Tensor:
    """``out [B, Hq, Lq, Dv]`` (attention without sinks) with the sink logits ``sinks [Hq]`` in every denominator:
    each query's output times ``sigmoid(lse - sink)`` (`plan_logsumexp`), in ``out.dtype``."""
    lse = plan_logsumexp(q, k, plan, scale)
    if sinks.shape != (q.shape[1],):
        raise ValueError(f"sinks must hold one logit per query head ({q.shape[1]}), got shape {tuple(sinks.shape)}")
    factor = torch.sigmoid(lse - sinks.float().to(lse.device)[None, :, None])  # [B, Hq, Lq]
    return (out.float() * factor[..., None]).to(out.dtype)
