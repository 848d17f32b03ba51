"""The reference kernel against a dense masked softmax built independently, pair by pair, in the test."""

from __future__ import annotations

import itertools

import pytest
import torch

from elastic_bench.kernels import BlockSelection, HeadPlan, Mode, StreamingGeometry, hybrid_attention


def visible(mode: Mode, p: int, j: int, geometry: StreamingGeometry, bs: int, table) -> bool:
    """Whether the query at absolute position p sees key j, written out from the definitions in method.md §7."""
    if j > p:
        return False
    if mode == Mode.FULL:
        return True
    if mode == Mode.STREAMING and geometry.granularity == "token":
        return j < geometry.sink or j >= p - geometry.local + 1
    if mode == Mode.STREAMING:
        sink_blocks, local_blocks = -(-geometry.sink // bs), -(-geometry.local // bs)
        r, c = p // bs, j // bs
        return c < sink_blocks or r - local_blocks + 1 <= c <= r
    return bool(table[p // bs][j // bs])


def dense_attention(q, k, v, plan: HeadPlan, scale: float) -> torch.Tensor:
    B, Hq, Lq, _ = q.shape
    H, Lk = k.shape[1], k.shape[2]
    G = Hq // H
    tables = plan.blocks.to_dense(-(-Lk // plan.block_size)).tolist() if plan.blocks is not None else None
    out = torch.zeros(B, Hq, Lq, q.shape[-1], dtype=torch.float64)
    for b, hq in itertools.product(range(B), range(Hq)):
        h = hq // G
        mode = Mode(int(plan.modes[b, h]))
        table = tables[b][hq] if tables is not None else None
        rows = [[visible(mode, Lk - Lq + i, j, plan.streaming, plan.block_size, table) for j in range(Lk)]
                for i in range(Lq)]
        mask = torch.tensor(rows)
        scores = (q[b, hq].double() @ k[b, h].double().T) * scale
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
        out[b, hq] = probs @ v[b, h].double()
    return out


def random_plan(B, H, Hq, Lk, bs, geometry, modes, seed=0) -> HeadPlan:
    g = torch.Generator().manual_seed(seed)
    mode_t = torch.tensor(modes, dtype=torch.uint8).view(B, H)
    n_blocks = -(-Lk // bs)
    dense = torch.rand(B, Hq, n_blocks, n_blocks, generator=g) < 0.4
    dense[..., 0] = True  # sink column, so every row sees something
    return HeadPlan(mode_t, geometry, BlockSelection.from_dense(dense), bs)


CASES = [
    # (B, Hq, H, Lq, Lk, block, geometry)
    (1, 2, 2, 37, 37, 8, StreamingGeometry(sink=3, local=5)),
    (2, 4, 2, 50, 50, 16, StreamingGeometry(sink=16, local=20, granularity="block")),
    (1, 8, 2, 21, 45, 8, StreamingGeometry(sink=4, local=9)),  # q shorter than k
    (2, 4, 1, 1, 33, 8, StreamingGeometry(sink=2, local=6, granularity="block")),  # decode
]


@pytest.mark.parametrize("B,Hq,H,Lq,Lk,bs,geometry", CASES, ids=lambda x: str(x) if isinstance(x, int) else None)
def test_every_mode_matches_dense_definition(B, Hq, H, Lq, Lk, bs, geometry):
    torch.manual_seed(0)
    q, k, v = torch.randn(B, Hq, Lq, 16), torch.randn(B, H, Lk, 16), torch.randn(B, H, Lk, 16)
    modes = [(i % 3) for i in range(B * H)]  # every mode appears (B*H >= 3) or a rotating subset
    plan = random_plan(B, H, Hq, Lk, bs, geometry, modes)
    out = hybrid_attention(q, k, v, plan, scale=0.25, backend="reference")
    expected = dense_attention(q, k, v, plan, 0.25)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_full_plan_equals_sdpa_with_gqa():
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 8, 40, 32), torch.randn(2, 2, 40, 32), torch.randn(2, 2, 40, 32)
    out = hybrid_attention(q, k, v, HeadPlan.full(2, 2), backend="reference")
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_batch_rows_with_different_plans_equal_each_row_alone():
    torch.manual_seed(2)
    q, k, v = torch.randn(2, 4, 30, 16), torch.randn(2, 2, 30, 16), torch.randn(2, 2, 30, 16)
    geometry = StreamingGeometry(sink=2, local=4)
    plan = random_plan(2, 2, 4, 30, 8, geometry, [Mode.FULL, Mode.STREAMING, Mode.BLOCK_SPARSE, Mode.FULL])
    together = hybrid_attention(q, k, v, plan, backend="reference")
    for b in range(2):
        alone = hybrid_attention(q[b : b + 1], k[b : b + 1], v[b : b + 1], plan.select([b]), backend="reference")
        torch.testing.assert_close(together[b : b + 1], alone)


def test_block_selection_roundtrip_and_select():
    dense = torch.rand(3, 4, 5, 5) < 0.5
    sel = BlockSelection.from_dense(dense)
    assert torch.equal(sel.to_dense(5), dense)
    assert torch.equal(sel.select([2, 0]).to_dense(5), dense[[2, 0]])


def test_plan_validation_errors():
    with pytest.raises(ValueError, match="BlockSelection"):
        HeadPlan.uniform(Mode.BLOCK_SPARSE, 1, 2)
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="plan is for"):
        hybrid_attention(q, k, k, HeadPlan.full(1, 4), backend="reference")
    with pytest.raises(ValueError, match="more queries"):
        hybrid_attention(torch.randn(1, 4, 9, 16), k, k, HeadPlan.full(1, 2), backend="reference")
    with pytest.raises(ValueError, match="unknown attention backend"):
        hybrid_attention(q, k, k, HeadPlan.full(1, 2), backend="nope")
    too_few_rows = BlockSelection.from_dense(torch.ones(1, 4, 2, 2, dtype=torch.bool))
    plan = HeadPlan.uniform(Mode.BLOCK_SPARSE, 1, 2, blocks=too_few_rows, block_size=2)  # 8 keys need 4 rows, not 2
    with pytest.raises(ValueError, match="block selection covers"):
        hybrid_attention(q, k, k, plan, backend="reference")


@pytest.mark.slow
def test_reference_handles_32k_tokens_on_cpu():
    """A 32K-token prompt fits in CPU memory (chunked over queries); streaming rows only see their window."""
    L = 32 * 1024
    q, k, v = torch.randn(1, 1, L, 8), torch.randn(1, 1, L, 8), torch.randn(1, 1, L, 8)
    plan = HeadPlan.uniform(Mode.STREAMING, 1, 1, streaming=StreamingGeometry(sink=1, local=1))
    out = hybrid_attention(q, k, v, plan, backend="reference")
    # sink 1 + window 1: query i attends keys {0, i} only.
    i = L - 1
    w = torch.softmax(torch.stack([q[0, 0, i] @ k[0, 0, 0], q[0, 0, i] @ k[0, 0, i]]) * 8**-0.5, 0)
    torch.testing.assert_close(out[0, 0, i], w[0] * v[0, 0, 0] + w[1] * v[0, 0, i], atol=1e-5, rtol=1e-5)
