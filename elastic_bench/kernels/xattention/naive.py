"""XAttention block selection in plain PyTorch: the ground truth of the fused and GEMM implementations (`fused`).

Antidiagonal scoring and threshold selection exactly as the contract in `elastic_bench.kernels.xattention` states it,
one query head at a time, in fp32.
"""

from __future__ import annotations

from typing import Literal

import torch

Rule = Literal["upstream", "strict"]
RULES = ("upstream", "strict")


def thresholds(threshold: float | torch.Tensor, num_query_heads: int, device) -> torch.Tensor:
    """τ as a float32 tensor ``[Hq]`` (one value per query head)."""
    return torch.as_tensor(threshold, dtype=torch.float32, device=device).expand(num_query_heads).contiguous()


def query_head_flags(heads: torch.Tensor | None, B: int, Hq: int, device) -> torch.Tensor:
    """Per-KV-head flags ``[B, H]`` expanded to query heads ``[B, Hq]`` (bool)."""
    if heads is None:
        return torch.ones(B, Hq, dtype=torch.bool, device=device)
    return heads.to(device=device, dtype=torch.bool).repeat_interleave(Hq // heads.shape[1], dim=1)


def upstream_chunk_size(k_len: int) -> int:
    """Upstream's automatic estimation chunk in tokens for ``k_len`` keys: ``max(min(max(2048, P), 2^28 / P), 2048)``
    with ``P`` the smallest power of two ``>= k_len`` (whole prompts up to 16K are one chunk; 20K-32K: 8192)."""
    p = 1 << max(k_len - 1, 0).bit_length()
    return max(min(max(2048, p), (1 << 28) // p), 2048)


def first_chunk_rows(rule: str, k_len: int, block_size: int) -> int:
    """How many leading absolute query-block rows follow the first-chunk rule: those in upstream's first estimation
    chunk of a one-shot prefill of ``k_len`` keys for ``"upstream"``, none for ``"strict"``."""
    if rule not in RULES:
        raise ValueError(f"XAttention selection rule must be one of {', '.join(RULES)}; got {rule!r}")
    return upstream_chunk_size(k_len) // block_size if rule == "upstream" else 0


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
    scores: torch.Tensor, tau: torch.Tensor, need: torch.Tensor, q_len: int, k_len: int, block_size: int,
    first_rows: int = 0,
) -> torch.Tensor:
    """Threshold selection on block scores ``[B, Hq, nB, nB]`` → bool mask ``[B, Hq, nB, nB]``.

    Args:
        scores: ``[B, Hq, nB, nB]`` block scores (zero above the diagonal).
        tau: ``[Hq]`` thresholds; need: bool ``[B, Hq]``, the rows to select (others stay empty).
        q_len, k_len, block_size: as `xattention_select` (rows without a query of the call stay empty).
        first_rows: rows ``1 <= r < first_rows`` follow the first-chunk rule (`first_chunk_rows`).
    """
    B, Hq, nB, _ = scores.shape
    r = torch.arange(nB, device=scores.device)[:, None]
    c = torch.arange(nB, device=scores.device)[None, :]
    first = (r >= 1) & (r < first_rows)  # [nB, 1]
    kept = (c == 0) | (c == r)
    counted = (c == r) | ((c == 0) & ~first)  # kept blocks whose mass counts before any candidate
    cand = (c < r) & ((c > 0) | first)
    required = tau[None, :, None] * scores.sum(-1)  # [B, Hq, nB]
    target = required - (scores * counted).sum(-1)
    vals = torch.where(cand, scores, -1.0)
    ordered, order = vals.sort(dim=-1, descending=True, stable=True)
    mass = ordered.clamp(min=0)
    before = torch.cumsum(mass, -1) - mass
    n_take = ((ordered >= 0) & (before < target[..., None])).sum(-1)  # the candidates taken: a prefix of `order`
    lagged = torch.minimum(n_take + (required > 0).long(), cand.sum(-1))  # one more where the running sum lags
    n_take = torch.where(first[:, 0], lagged, n_take)
    take = torch.arange(nB, device=scores.device) < n_take[..., None]
    selected = torch.zeros_like(take).scatter_(-1, order, take) | kept
    rows = need[:, :, None] & rows_with_queries(q_len, k_len, block_size, scores.device)[None, None, :]
    return selected & rows[..., None]
