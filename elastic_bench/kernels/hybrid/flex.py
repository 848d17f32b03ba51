"""FlexAttention backend (``backend="flex"``): one compiled `flex_attention` call built from the HeadPlan.

Design decisions:
- The `BlockMask` is built directly from the plan, never from a dense ``[Q, KV]`` mask: every (sample, query head,
  query block) row lists its fully visible key blocks (no mask_mod, faster) and its partially visible ones (diagonal,
  ragged window start, partial sink), computed at block level on the GPU. BLOCK_SPARSE rows take their blocks from the
  plan's `BlockSelection`.
- GQA pitfall: FlexAttention reads mask row ``h % H_mask`` for query head ``h``, so the mask is always built with one
  row per *query* head (per-KV-head modes repeated G times), never per KV head.
- One mask_mod for every mode: causal, bottom-right, plus the sink and a per-head window start whose parameters are
  small ``[B, Hq]`` tensors captured by the closure; new plans change tensor values only, which does not recompile.
- `flex_attention` is compiled once with ``dynamic=False`` (the fast kernels; new lengths compile once each, so dynamo's
  recompile limit is raised for length sweeps). It is differentiable: when a gradient is needed the mask also carries
  the transposed block lists FlexAttention's backward reads.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from ..plan import HeadPlan, Mode, StreamingGeometry
from .fused import streaming_params


def available(device: torch.device) -> bool:
    """CUDA only: FlexAttention also compiles for the CPU, but slowly (call `flex_hybrid_attention` directly there)."""
    return device.type == "cuda" and importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


@functools.cache
def _compiled_flex():
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 64))
    return torch.compile(flex_attention, dynamic=False)


def _ordered(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Bool ``[..., n]`` → (counts int32 ``[...]``, int32 ``[..., n]``: each row's True columns first, ascending)."""
    counts = mask.sum(-1, dtype=torch.int32)
    order = torch.argsort(mask.to(torch.uint8), dim=-1, descending=True, stable=True)
    return counts, order.to(torch.int32)


def block_mask(plan: HeadPlan, num_query_heads: int, q_len: int, k_len: int, device, with_grad: bool = False):
    """FlexAttention `BlockMask` of ``plan`` for ``q_len`` queries over ``k_len`` keys (rows per query head). A plan
    whose modes are on the host and all one mode (a training branch, `HeadPlan.uniform`) takes a mask built once per
    shape (`_uniform_mask`): it depends on nothing else.

    Returns:
        ``BlockMask`` with ``[B, Hq, ceil(q_len / bs), ceil(k_len / bs)]`` block lists, ``bs = plan.block_size``.
    """
    modes = plan.modes
    if modes.device.type == "cpu" and plan.blocks is None and modes.numel() and bool((modes == modes[0, 0]).all()):
        B, H = modes.shape
        return _uniform_mask(int(modes[0, 0]), B, H, plan.streaming, plan.block_size, num_query_heads, q_len, k_len,
                             torch.device(device), with_grad)
    return build_block_mask(plan, num_query_heads, q_len, k_len, device, with_grad)


@functools.lru_cache(maxsize=64)
def _uniform_mask(mode: int, batch_size: int, num_kv_heads: int, streaming, block_size: int, num_query_heads: int,
                  q_len: int, k_len: int, device: torch.device, with_grad: bool):
    plan = HeadPlan.uniform(Mode(mode), batch_size, num_kv_heads, streaming=streaming, block_size=block_size)
    return build_block_mask(plan, num_query_heads, q_len, k_len, device, with_grad)


def build_block_mask(plan: HeadPlan, num_query_heads: int, q_len: int, k_len: int, device, with_grad: bool = False):
    """`block_mask`, built afresh (what `block_mask` caches for a uniform plan)."""
    from torch.nn.attention.flex_attention import BlockMask

    B, H = plan.modes.shape
    Hq, bs, off = num_query_heads, plan.block_size, k_len - q_len
    n_q, n_k = -(-q_len // bs), -(-k_len // bs)
    modes = plan.modes.to(device=device, dtype=torch.int32, non_blocking=True).repeat_interleave(Hq // H, dim=1)
    streaming = modes == Mode.STREAMING
    stream_sink, stream_quantum, stream_back = streaming_params(plan)
    sink = torch.where(streaming, stream_sink, 0).to(torch.int32)
    quantum = torch.where(streaming, stream_quantum, 1).to(torch.int32)
    back = torch.where(streaming, stream_back, k_len).to(torch.int32)

    r = torch.arange(n_q, device=device, dtype=torch.int32)[:, None]
    c = torch.arange(n_k, device=device, dtype=torch.int32)[None, :]
    p0, p1 = off + r * bs, torch.clamp(off + (r + 1) * bs, max=k_len) - 1  # first/last query position of a row
    k0, k1 = c * bs, torch.clamp((c + 1) * bs, max=k_len) - 1  # first/last key of a column
    s, qu, bk = (t[:, :, None, None] for t in (sink, quantum, back))
    w0 = torch.clamp((p0 // qu - bk) * qu, min=0)  # window start of the row's first and last query
    w1 = torch.clamp((p1 // qu - bk) * qu, min=0)
    some = (k0 <= p1) & ((k0 < s) | (k1 >= w0))
    every = (k1 <= p0) & ((k1 < s) | (k0 >= w1))
    if plan.has(Mode.BLOCK_SPARSE):
        if off % bs:
            raise ValueError(f"flex needs BLOCK_SPARSE query chunks to start on a block boundary (offset {off})")
        table = plan.blocks.to_dense(n_k).to(device)[:, :, off // bs : off // bs + n_q]
        sparse = (modes == Mode.BLOCK_SPARSE)[:, :, None, None]
        some = torch.where(sparse, some & table, some)
        every = torch.where(sparse, every & table, every)
    partial_num, partial_idx = _ordered(some & ~every)
    full_num, full_idx = _ordered(every)
    offset = torch.tensor(off, dtype=torch.int32, device=device)

    def mask_mod(b, h, q_idx, kv_idx):
        p = q_idx + offset
        window = (p // quantum[b, h] - back[b, h]) * quantum[b, h]
        return (kv_idx <= p) & ((kv_idx < sink[b, h]) | (kv_idx >= window))

    return BlockMask.from_kv_blocks(
        partial_num, partial_idx, full_num, full_idx, BLOCK_SIZE=bs, mask_mod=mask_mod, seq_lengths=(q_len, k_len),
        compute_q_blocks=with_grad,
    )


def flex_hybrid_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: HeadPlan, scale: float, mask=None
) -> torch.Tensor:
    """Hybrid attention through compiled FlexAttention (``backend="flex"``); differentiable in q, k and v.

    Args:
        q: ``[B, Hq, Lq, D]``; k, v: ``[B, H, Lk, D]``.
        plan: the HeadPlan; BLOCK_SPARSE heads need ``(Lk - Lq) % block_size == 0``.
        scale: softmax scale.
        mask: a prebuilt `block_mask` of this plan and shape (built when None).

    Returns:
        ``[B, Hq, Lq, D]``. A query row with no visible key is zero.
    """
    if mask is None:
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        mask = block_mask(plan, q.shape[1], q.shape[2], k.shape[2], q.device, with_grad=grad)
    return flex_masked_attention(q, k, v, mask, scale)


def document_block_mask(bounds: list[int], length: int, streaming: StreamingGeometry | None, block_size: int, device,
                        with_grad: bool = False):
    """FlexAttention `BlockMask` of a packed row whose documents attend only themselves: causal attention inside
    each document (``streaming`` None), or a STREAMING head's sink and window counted from the document's start.

    Args:
        bounds: ``[N + 1]`` document boundaries on the host (``cu_seq_lens``: 0 first, ascending); the tokens from
            ``bounds[-1]`` to ``length`` (padding) form one more document.
        length: the row's tokens, padding included.
        streaming: an unchunked streaming geometry, or None for full attention.
        block_size: the mask's block size.

    Returns:
        ``BlockMask`` of one row and one head (every head shares it), ``[1, 1, n, n]`` block lists with ``n =
        ceil(length / block_size)``. Blocks inside one document are classified exactly as `build_block_mask` does
        for a lone sequence; a block pair spanning a document boundary is partial (its mask_mod decides).
    """
    from torch.nn.attention.flex_attention import BlockMask

    if streaming is not None and streaming.chunk_starts:
        raise ValueError("document_block_mask takes an unchunked streaming geometry")
    edges = torch.tensor([*bounds[1:], length], dtype=torch.int32, device=device)
    pos = torch.arange(length, dtype=torch.int32, device=device)
    doc = torch.searchsorted(edges, pos, right=True).to(torch.int32)  # [length]: its document
    start = torch.cat([torch.zeros(1, dtype=torch.int32, device=device), edges])[doc]  # [length]: its document's start
    if streaming is None:
        sink, quantum, back = length, 1, length  # every earlier key of the document
    else:
        sink, (quantum, back) = streaming.sink_end(block_size), streaming.window_steps(block_size)
    n = -(-length // block_size)
    first = torch.arange(n, dtype=torch.int32, device=device) * block_size
    last = torch.clamp(first + block_size, max=length) - 1
    d0, d1, s0 = doc[first.long()], doc[last.long()], start[first.long()]
    p0, p1 = (first - s0)[:, None], (last - s0)[:, None]  # query block rows, positions in their first document
    k0, k1 = first[None, :] - s0[:, None], last[None, :] - s0[:, None]  # key block columns, in that document
    single = (d0 == d1)[:, None] & (d0 == d1)[None, :] & (d0[:, None] == d0[None, :])
    overlap = torch.maximum(d0[:, None], d0[None, :]) <= torch.minimum(d1[:, None], d1[None, :])
    w0 = torch.clamp((p0 // quantum - back) * quantum, min=0)
    w1 = torch.clamp((p1 // quantum - back) * quantum, min=0)
    some_inside = (k0 <= p1) & ((k0 < sink) | (k1 >= w0))
    every = single & (k1 <= p0) & ((k1 < sink) | (k0 >= w1))
    some = torch.where(single, some_inside, overlap & (first[None, :] <= last[:, None]))
    partial_num, partial_idx = _ordered((some & ~every)[None, None])
    full_num, full_idx = _ordered(every[None, None])

    def mask_mod(b, h, q_idx, kv_idx):
        origin = start[q_idx]
        rel_q, rel_k = q_idx - origin, kv_idx - origin
        window = (rel_q // quantum - back) * quantum
        return (doc[q_idx] == doc[kv_idx]) & (kv_idx <= q_idx) & ((rel_k < sink) | (rel_k >= window))

    return BlockMask.from_kv_blocks(
        partial_num, partial_idx, full_num, full_idx, BLOCK_SIZE=block_size, mask_mod=mask_mod,
        seq_lengths=(length, length), compute_q_blocks=with_grad,
    )


def flex_masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, scale: float) -> torch.Tensor:
    """Compiled `flex_attention` of ``q [B, Hq, L, D]`` over ``k, v [B, H, L, D]`` under a prebuilt ``mask`` (e.g.
    `document_block_mask`); differentiable in q, k and v. Returns ``[B, Hq, L, D]``; a query row with no visible key
    is zero."""
    return _compiled_flex()(q, k, v, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
