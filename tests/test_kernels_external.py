"""The block_sparse_attn and flash_attn adapters, against stand-ins that implement the packages' documented semantics
(`reference/baselines.md` §5.3–5.4 and FlashAttention's ``window_size``) with dense masks on the CPU."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from elastic_bench.kernels import BlockSelection, HeadPlan, StreamingGeometry, hybrid_attention
from elastic_bench.kernels.hybrid import external


def _attend(q, k, v, allowed, scale):
    """q [Sq, Hq, D], k/v [Sk, Hk, D], allowed [Hq, Sq, Sk] → ([Sq, Hq, D], lse [Hq, Sq])."""
    G = q.shape[1] // k.shape[1]
    kk, vv = (t.float().repeat_interleave(G, dim=1).transpose(0, 1) for t in (k, v))
    s = (q.float().transpose(0, 1) @ kk.transpose(1, 2)) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return (torch.softmax(s, -1).nan_to_num(0.0) @ vv).transpose(0, 1), lse


def _fake_bsa(q, k, v, cu_q, cu_k, head_mask_type, streaming_info, base_blockmask, max_q, max_k, p_dropout,
              deterministic=False, softmax_scale=None, is_causal=False, exact_streaming=False):
    Sq, Hq, _ = q.shape
    Sk = k.shape[0]
    i = torch.arange(Sq)[:, None] + (Sk - Sq)  # absolute query positions (bottom-right)
    j = torch.arange(Sk)[None, :]
    allowed, sparse_index = [], 0
    for h in range(Hq):
        kind, sink, local = int(head_mask_type[h]), int(streaming_info[2 * h]), int(streaming_info[2 * h + 1])
        causal = j <= i
        if kind == 0:
            mask = causal
        elif kind < 0 and exact_streaming:
            mask = causal & ((j >= i - (local - 1)) | (j < sink))
        elif kind < 0:
            qb, kb = i // 128, j // 128
            mask = causal & ((kb < sink) | ((kb >= qb + 1 - local) & (kb <= qb)))
        else:
            rows = base_blockmask[0, sparse_index]  # rows count query blocks from the start of q
            sparse_index += 1
            mask = causal & rows[torch.arange(Sq)[:, None] // 128, j // 128]
        allowed.append(mask)
    return _attend(q, k, v, torch.stack(allowed), softmax_scale)[0].to(q.dtype)


def _fake_flash(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), return_attn_probs=False):
    B, Sq, Hq, _ = q.shape
    Sk = k.shape[1]
    i = torch.arange(Sq)[:, None] + (Sk - Sq)
    j = torch.arange(Sk)[None, :]
    mask = (j <= i) if causal else torch.ones(Sq, Sk, dtype=torch.bool)
    if window_size[0] >= 0:
        mask = mask & (j >= i - window_size[0])
    outs, lses = zip(*(_attend(q[b], k[b], v[b], mask.expand(Hq, Sq, Sk), softmax_scale) for b in range(B)))
    out = torch.stack(outs).to(q.dtype)
    return (out, torch.stack(lses), None) if return_attn_probs else out


@pytest.fixture
def fake_packages(monkeypatch):
    monkeypatch.setitem(sys.modules, "block_sparse_attn", types.SimpleNamespace(block_sparse_attn_func=_fake_bsa))
    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(flash_attn_func=_fake_flash))


def _inputs(B, H, G, Lq, Lk, D=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H * G, Lq, D, generator=gen).bfloat16()
    k, v = (torch.randn(B, H, Lk, D, generator=gen).bfloat16() for _ in "kv")
    return q, k, v


def _close(out, q, k, v, plan):
    ref = hybrid_attention(q.float(), k.float(), v.float(), plan, backend="reference")
    assert (out.float() - ref).abs().max() < 3e-2


def test_bsa_head_arguments_map_modes_per_query_head():
    blocks = BlockSelection.from_dense(torch.ones(1, 6, 1, 1, dtype=torch.bool))
    plan = HeadPlan(torch.tensor([[0, 1, 2]], dtype=torch.uint8), StreamingGeometry(128, 2048, "block"), blocks)
    head_type, info, exact = external.bsa_head_arguments(plan, 0, 6)
    assert head_type.tolist() == [0, 0, -1, -1, 1, 1]
    assert info.tolist() == [1, 16] * 6 and not exact
    token = HeadPlan(plan.modes, StreamingGeometry(64, 256, "token"), blocks)
    assert external.bsa_head_arguments(token, 0, 6)[1].tolist() == [64, 256] * 6


@pytest.mark.parametrize("granularity", ["block", "token"])
def test_block_sparse_attn_adapter(fake_packages, granularity):
    q, k, v = _inputs(2, 3, 2, 384, 640)
    n = 5
    gen = torch.Generator().manual_seed(1)
    r, c = torch.arange(n)[:, None], torch.arange(n)[None, :]
    dense = ((torch.rand(2, 6, n, n, generator=gen) < 0.5) & (c <= r)) | (c == r)
    modes = torch.tensor([[0, 1, 2], [2, 2, 1]], dtype=torch.uint8)
    geometry = StreamingGeometry(128, 256, "block") if granularity == "block" else StreamingGeometry(7, 200, "token")
    plan = HeadPlan(modes, geometry, BlockSelection.from_dense(dense))
    _close(external.block_sparse_attn(q, k, v, plan, 32**-0.5), q, k, v, plan)


def test_block_sparse_attn_adapter_rejects_unaligned_chunks(fake_packages):
    q, k, v = _inputs(1, 1, 2, 100, 640)
    plan = HeadPlan(torch.tensor([[2]], dtype=torch.uint8), blocks=BlockSelection.from_dense(
        torch.ones(1, 2, 5, 5, dtype=torch.bool)))
    with pytest.raises(ValueError, match="block boundary"):
        external.block_sparse_attn(q, k, v, plan, 1.0)


def test_flash_attn_adapter_merges_sink_through_lse(fake_packages):
    q, k, v = _inputs(2, 2, 2, 300, 300)
    plan = HeadPlan(torch.tensor([[0, 1], [1, 1]], dtype=torch.uint8), StreamingGeometry(20, 64, "token"))
    _close(external.flash_attn(q, k, v, plan, 32**-0.5), q, k, v, plan)
    q_chunk = q[:, :, -50:]
    _close(external.flash_attn(q_chunk, k, v, plan, 32**-0.5), q_chunk, k, v, plan)


def test_flash_attn_adapter_rejects_what_it_cannot_compute(fake_packages):
    q, k, v = _inputs(1, 1, 2, 64, 64)
    with pytest.raises(ValueError, match="token-granular"):
        external.flash_attn(q, k, v, HeadPlan.uniform(1, 1, 1, streaming=StreamingGeometry(granularity="block")), 1.0)
    sparse = HeadPlan(torch.tensor([[2]], dtype=torch.uint8), blocks=BlockSelection.from_dense(
        torch.ones(1, 2, 1, 1, dtype=torch.bool)))
    with pytest.raises(ValueError, match="block-sparse"):
        external.flash_attn(q, k, v, sparse, 1.0)


def test_adapters_are_unavailable_without_their_packages():
    for name in ("block_sparse_attn", "flash_attn"):
        assert name not in __import__("elastic_bench.kernels", fromlist=["x"]).available_backends("cpu")
