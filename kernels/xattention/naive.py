"""XAttention block selection in plain PyTorch: the ground truth of the fused and GEMM implementations (`fused`).

Antidiagonal scoring and threshold selection exactly as the contract in `elastic_bench.kernels.xattention` states it,
one query head at a time, in fp32.
"""

from __future__ import annotations

import torch


def thresholds(threshold: float | torch.Tensor, num_query_heads: int, device) -> torch.Tensor:
    """τ as a float32 tensor ``[Hq]`` (one value per query head)."""
    return torch.as_tensor(threshold, dtype=torch.float32, device=device).expand(num_query_heads).contiguous()


def query_head_flags(heads: torch.Tensor | None, B: int, Hq: int, device) -> torch.Tensor:
    """Per-KV-head flags ``[B, H]`` expanded to query heads ``[B, Hq]`` (bool)."""
    if heads is None:
        return torch.ones(B, Hq, dtype=torch.bool, device=device)
    return heads.to(device=device, dtype=torch.bool).repeat_interleave(Hq // heads.shape[1], dim=1)


def rows_with_queries(q_len: int, k_len: int, block_size: int, device) -> torch.Tensor:
    """Bool ``[nB]``: the absolute query-block rows that hold at least one query of the call."""
    r = torch.arange(-(-k_len // block_size), device=device)
    return ((r + 1) * block_size > k_len - q_len) & (r * block_size < k_len)


def antidiagonal_scores_naive(
    q: torch.Tensor, k: torch.Tensor, stride: int, block_size: int, heads: torch.Tensor | None, chunk_blocks: int = 16
) -> torch.Tensor:
    B, Hq, Lq, D = q.shape
    H, Lk = k.shape[1], k.shape[2]
    G, S, per = Hq // H, stride, block_size // stride
    nB = -(-Lk // block_size)
    n_t = nB * per
    need = query_head_flags(heads, B, Hq, q.device)
    kp = torch.zeros(B, H, nB * block_size, D, device=q.device)
    kp[:, :, :Lk] = k.float()
    qp = torch.zeros(B, Hq, nB * block_size, D, device=q.device)
    qp[:, :, Lk - Lq : Lk] = q.float()
    kt = kp.view(B, H, n_t, S * D)
    qt = qp.view(B, Hq, n_t, S, D).flip(3).reshape(B, Hq, n_t, S * D)
    t = torch.arange(n_t, device=q.device)
    t_has_query = ((t + 1) * S > Lk - Lq) & (t * S < Lk)
    k_ok = t * S < Lk
    out = torch.zeros(B, Hq, nB, nB, device=q.device)
    scale = 1.0 / (D**0.5 * S)
    for b in range(B):
        for hq in range(Hq):
            if not bool(need[b, hq]):
                continue
            for r0 in range(0, nB, chunk_blocks):
                rows = slice(r0 * per, min(r0 + chunk_blocks, nB) * per)
                s = (qt[b, hq, rows] @ kt[b, hq // G].T) * scale  # [c, n_t]
                visible = (t[None, :] <= t[rows, None]) & k_ok[None, :]
                p = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1) * t_has_query[rows, None]
                out[b, hq, r0 : r0 + p.shape[0] // per] = p.view(-1, per, nB, per).sum((1, 3))
    return out


def select_blocks_naive(
    scores: torch.Tensor, tau: torch.Tensor, need: torch.Tensor, q_len: int, k_len: int, block_size: int
) -> torch.Tensor:
    B, Hq, nB, _ = scores.shape
    r = torch.arange(nB, device=scores.device)[:, None]
    c = torch.arange(nB, device=scores.device)[None, :]
    forced = (c == 0) | (c == r)
    cand = (c > 0) & (c < r)
    target = tau[None, :, None] * scores.sum(-1) - (scores * forced).sum(-1)  # [B, Hq, nB]
    vals = torch.where(cand, scores, -1.0)
    ordered, order = vals.sort(dim=-1, descending=True, stable=True)
    mass = ordered.clamp(min=0)
    before = torch.cumsum(mass, -1) - mass
    take = (ordered >= 0) & (before < target[..., None])
    selected = torch.zeros_like(take).scatter_(-1, order, take) | forced
    rows = need[:, :, None] & rows_with_queries(q_len, k_len, block_size, scores.device)[None, None, :]
    return selected & rows[..., None]
