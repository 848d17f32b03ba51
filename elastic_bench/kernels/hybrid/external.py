"""Optional backends over external CUDA packages, used only when they import: ``block_sparse_attn`` and ``flash_attn``.

Design decisions:
- ``block_sparse_attn`` (mit-han-lab/Block-Sparse-Attention, ``block_sparse_attn_func``) has all three modes in one
  launch. Modes map per query head to ``head_mask_type`` (FULL 0, STREAMING -1, BLOCK_SPARSE 1); ``streaming_info`` is
  ``[sink, local]`` per head, in blocks for block geometry and in tokens (``exact_streaming``) for token geometry;
  ``base_blockmask`` holds the rows of the block-sparse heads only, in head order. Its head types are per launch, not
  per sample, so samples are launched one at a time.
- ``flash_attn`` (FlashAttention-2) has no sink tokens and no block-sparse mode: FULL heads use ``causal=True``,
  token-granular STREAMING heads a ``window_size=(local - 1, 0)`` call whose log-sum-exp is merged with a small
  PyTorch pass over the sink keys the window does not cover. Block-granular streaming and BLOCK_SPARSE raise.
- Both take the (sample, KV head) pairs of one mode as one batch, like `fused.split_hybrid_attention`.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from ..plan import HeadPlan, Mode
from .chunked import check_unchunked


@functools.cache
def _importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def block_sparse_attn_available(device: torch.device) -> bool:
    """True on CUDA when the ``block_sparse_attn`` package is installed."""
    return device.type == "cuda" and _importable("block_sparse_attn")


def flash_attn_available(device: torch.device) -> bool:
    """True on CUDA when the ``flash_attn`` package is installed."""
    return device.type == "cuda" and _importable("flash_attn")


def bsa_head_arguments(plan: HeadPlan, sample: int, num_query_heads: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(head_mask_type int32 [Hq], streaming_info int32 [2·Hq], exact_streaming)`` of one sample's plan."""
    check_unchunked(plan)
    G = num_query_heads // plan.num_kv_heads
    modes = plan.modes[sample].long().repeat_interleave(G)
    head_type = torch.zeros(num_query_heads, dtype=torch.int32)
    head_type[modes.cpu() == Mode.STREAMING] = -1
    head_type[modes.cpu() == Mode.BLOCK_SPARSE] = 1
    geo = plan.streaming
    exact = geo.granularity == "token"
    sink, local = (geo.sink, geo.local) if exact else geo.blocks(plan.block_size)
    return head_type, torch.tensor([sink, local] * num_query_heads, dtype=torch.int32), exact


def block_sparse_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: HeadPlan, scale: float) -> torch.Tensor:
    """Hybrid attention through ``block_sparse_attn_func`` (``backend="block_sparse_attn"``).

    Args:
        q: ``[B, Hq, Lq, D]``; k, v: ``[B, H, Lk, D]``; fp16/bf16, ``D`` in {32, 64, 128}; ``plan.block_size == 128``;
            with BLOCK_SPARSE heads ``(Lk - Lq) % 128 == 0``.

    Returns:
        ``[B, Hq, Lq, D]``.
    """
    from block_sparse_attn import block_sparse_attn_func

    B, Hq, Lq, D = q.shape
    Lk = k.shape[2]
    if q.dtype not in (torch.float16, torch.bfloat16) or D not in (32, 64, 128) or plan.block_size != 128:
        raise ValueError(
            f"block_sparse_attn needs fp16/bf16, head_dim 32/64/128 and block_size 128; got {q.dtype}, {D}, "
            f"{plan.block_size}"
        )
    off = Lk - Lq
    if plan.has(Mode.BLOCK_SPARSE) and off % 128:
        raise ValueError(f"block_sparse_attn needs the query chunk to start on a block boundary (offset {off})")
    dense = plan.blocks.to_dense(-(-Lk // 128)) if plan.has(Mode.BLOCK_SPARSE) else None
    cu_q = torch.tensor([0, Lq], dtype=torch.int32, device=q.device)
    cu_k = torch.tensor([0, Lk], dtype=torch.int32, device=q.device)
    out = torch.empty_like(q)
    for b in range(B):
        head_type, info, exact = bsa_head_arguments(plan, b, Hq)
        sparse_heads = (head_type == 1).nonzero().flatten()
        base = None
        if len(sparse_heads):
            base = dense[b, sparse_heads.to(dense.device), off // 128 :][None].to(q.device)
        out_b = block_sparse_attn_func(
            q[b].transpose(0, 1).contiguous(), k[b].transpose(0, 1).contiguous(), v[b].transpose(0, 1).contiguous(),
            cu_q, cu_k, head_type.to(q.device), info.to(q.device), base, Lq, Lk, 0.0,
            deterministic=False, softmax_scale=scale, is_causal=True, exact_streaming=exact,
        )
        out[b] = out_b.transpose(0, 1)
    return out


def flash_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: HeadPlan, scale: float) -> torch.Tensor:
    """Hybrid attention through FlashAttention-2 (``backend="flash_attn"``): FULL and token-granular STREAMING heads.

    Args:
        q: ``[B, Hq, Lq, D]``; k, v: ``[B, H, Lk, D]``; fp16/bf16.

    Returns:
        ``[B, Hq, Lq, D]``.
    """
    from flash_attn import flash_attn_func

    check_unchunked(plan)
    if plan.has(Mode.BLOCK_SPARSE):
        raise ValueError("flash_attn has no block-sparse mode; use triton, split, flex or block_sparse_attn")
    if plan.has(Mode.STREAMING) and plan.streaming.granularity != "token":
        raise ValueError("flash_attn windows are token-granular; block-granular streaming needs another backend")
    B, Hq, Lq, D = q.shape
    H, Lk = k.shape[1], k.shape[2]
    G = Hq // H
    out = torch.empty_like(q)
    for mode in (Mode.FULL, Mode.STREAMING):
        b_idx, h_idx = (plan.modes.to(q.device) == mode).nonzero(as_tuple=True)
        if not len(b_idx):
            continue
        qg = q.unflatten(1, (H, G))[b_idx, h_idx].transpose(1, 2)  # [n, Lq, G, D]
        kg, vg = (t[b_idx, h_idx].unsqueeze(2) for t in (k, v))  # [n, Lk, 1, D]
        if mode == Mode.FULL:
            o = flash_attn_func(qg, kg, vg, softmax_scale=scale, causal=True)
        else:
            o, lse, _ = flash_attn_func(
                qg, kg, vg, softmax_scale=scale, causal=True, window_size=(plan.streaming.local - 1, 0),
                return_attn_probs=True,
            )
            o = _merge_sink(o, lse, qg, kg, vg, plan.streaming.sink, plan.streaming.local, Lk, scale)
        out.unflatten(1, (H, G))[b_idx, h_idx] = o.transpose(1, 2).to(q.dtype)
    return out


def _merge_sink(o, lse, q, k, v, sink: int, local: int, k_len: int, scale: float) -> torch.Tensor:
    """Add the sink keys a query's window does not cover (``j < min(sink, p - local + 1)``) through the LSE.

    ``o [n, Lq, G, D]`` and ``lse [n, G, Lq]`` are the window call's output; q ``[n, Lq, G, D]``, k/v ``[n, Lk, 1, D]``.
    """
    sink = min(sink, k_len)
    if sink == 0:
        return o
    Lq = q.shape[1]
    p = torch.arange(k_len - Lq, k_len, device=q.device)
    j = torch.arange(sink, device=q.device)
    uncovered = j[None, :] < torch.clamp(p - local + 1, max=sink)[:, None]  # [Lq, sink]
    s = torch.einsum("nqgd,nkd->ngqk", q.float(), k[:, :sink, 0].float()) * scale
    s = s.masked_fill(~uncovered, float("-inf"))
    lse_sink = torch.logsumexp(s, dim=-1)  # [n, G, Lq]
    o_sink = torch.einsum("ngqk,nkd->nqgd", torch.softmax(s, -1).nan_to_num(0.0), v[:, :sink, 0].float())
    total = torch.logaddexp(lse.float(), lse_sink)
    w_win = torch.exp(lse.float() - total).transpose(1, 2)[..., None]  # [n, Lq, G, 1]
    w_sink = torch.exp(lse_sink - total).transpose(1, 2)[..., None]
    return o.float() * w_win + o_sink * w_sink
