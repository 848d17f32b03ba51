"""The FlexAttention backend against ``reference`` (compiled FlexAttention on the CPU compiles slowly: few shapes)."""

from __future__ import annotations

import pytest
import torch

from elastic_bench.kernels import BlockSelection, HeadPlan, Mode, StreamingGeometry, hybrid_attention
from elastic_bench.kernels.hybrid.flex import block_mask, flex_hybrid_attention


def _plan(modes, B, H, Hq, Lk, geometry, gen, block_size=128):
    n = -(-Lk // block_size)
    r, c = torch.arange(n)[:, None], torch.arange(n)[None, :]
    dense = ((torch.rand(B, Hq, n, n, generator=gen) < 0.5) & (c <= r)) | (c == r)
    dense[:, 0, 1] = False  # an empty row
    codes = torch.tensor([["FSB".index(m) for m in row] for row in modes], dtype=torch.uint8)
    return HeadPlan(codes, geometry, BlockSelection.from_dense(dense), block_size)


@pytest.mark.slow
def test_flex_matches_reference_for_mixed_plans():
    gen = torch.Generator().manual_seed(0)
    B, H, G, Lk, D = 2, 2, 2, 300, 16
    q, k, v = (torch.randn(B, h, Lk, D, generator=gen) for h in (H * G, H, H))
    plans = [
        _plan(["FS", "BF"], B, H, H * G, Lk, StreamingGeometry(16, 40, "token"), gen),
        _plan(["SB", "SS"], B, H, H * G, Lk, StreamingGeometry(128, 256, "block"), gen),
        _plan(["BB", "FF"], B, H, H * G, Lk, StreamingGeometry(0, 100, "token"), gen),
    ]
    for plan in plans:  # new plans change mask values only: one compilation for all of them
        out = flex_hybrid_attention(q, k, v, plan, D**-0.5)
        ref = hybrid_attention(q, k, v, plan, backend="reference")
        assert (out - ref).abs().max() < 1e-4
    q_chunk = q[:, :, Lk - 44 :]  # a chunk of queries at the end (bottom-right alignment)
    plan = _plan(["FS", "SF"], B, H, H * G, Lk, StreamingGeometry(3, 150, "token"), gen)
    out = flex_hybrid_attention(q_chunk, k, v, plan, D**-0.5)
    assert (out - hybrid_attention(q_chunk, k, v, plan, backend="reference")).abs().max() < 1e-4


def test_block_mask_rows_are_per_query_head():
    # KV head 0 FULL, KV head 1 STREAMING with G = 2: query heads 0, 1 must get FULL rows, 2, 3 streaming rows.
    # (A mask built per KV head would be read as row h % 2 by FlexAttention: FULL, STREAMING, FULL, STREAMING.)
    plan = HeadPlan(torch.tensor([[0, 1]], dtype=torch.uint8), StreamingGeometry(128, 128, "block"))
    mask = block_mask(plan, 4, 1024, 1024, "cpu")
    visited = mask.kv_num_blocks + mask.full_kv_num_blocks  # [1, Hq, nQ]
    assert visited[0, :2, -1].tolist() == [8, 8]
    assert visited[0, 2:, -1].tolist() == [2, 2]  # sink block + diagonal block


def test_block_sparse_chunk_must_start_on_a_block():
    plan = _plan(["BF"], 1, 2, 4, 300, StreamingGeometry(), torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="block boundary"):
        block_mask(plan, 4, 100, 300, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [Mode.FULL, Mode.STREAMING])
def test_flex_is_differentiable(mode):
    # FlexAttention has no backward on the CPU; the router trainer uses this path on CUDA.
    gen = torch.Generator(device="cuda").manual_seed(1)
    base = [torch.randn(1, h, 1000, 64, device="cuda", generator=gen) for h in (8, 2, 2)]
    plan = HeadPlan.uniform(mode, 1, 2, device="cuda", streaming=StreamingGeometry(128, 256, "block"))
    weight = torch.randn(1, 8, 1000, 64, device="cuda", generator=gen)
    grads = []
    for fn, dtype in ((flex_hybrid_attention, torch.bfloat16), (_reference, torch.float32)):
        q, k, v = (t.to(dtype).requires_grad_() for t in base)
        (fn(q, k, v, plan, 0.125).float() * weight).sum().backward()
        grads.append([t.grad.float() for t in (q, k, v)])
    for got, want in zip(*grads):
        assert (got - want).norm() / want.norm() < 2e-2


def _reference(q, k, v, plan, scale):
    return hybrid_attention(q, k, v, plan, scale, backend="reference")


def test_a_uniform_host_plan_takes_the_mask_built_once_for_its_shape():
    # the training forward's branches: every head FULL, or every head STREAMING, at one padded length
    from elastic_bench.kernels.hybrid.flex import build_block_mask

    geometry = StreamingGeometry(128, 256, "block")
    streaming = HeadPlan.uniform(Mode.STREAMING, 1, 2, streaming=geometry)
    first = block_mask(streaming, 4, 1024, 1024, "cpu", with_grad=True)
    assert block_mask(HeadPlan.uniform(Mode.STREAMING, 1, 2, streaming=geometry), 4, 1024, 1024, "cpu",
                      with_grad=True) is first
    fresh = build_block_mask(streaming, 4, 1024, 1024, "cpu", with_grad=True)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks"):
        assert torch.equal(getattr(first, name), getattr(fresh, name)), name
    full = block_mask(HeadPlan.uniform(Mode.FULL, 1, 2, streaming=geometry), 4, 1024, 1024, "cpu", with_grad=True)
    assert full is not first and (full.kv_num_blocks + full.full_kv_num_blocks)[0, 0, -1] == 8
    assert block_mask(streaming, 4, 512, 512, "cpu", with_grad=True) is not first  # another shape
    mixed = HeadPlan(torch.tensor([[0, 1]], dtype=torch.uint8), geometry)
    assert block_mask(mixed, 4, 1024, 1024, "cpu") is not block_mask(mixed, 4, 1024, 1024, "cpu")
