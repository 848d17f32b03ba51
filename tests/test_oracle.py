"""The oracle: the true attention's block masses and top-scoring blocks against brute-force references, dense
attention at budget 0, and its ΩESR counted by the same code as every block-sparse method's."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from elastic_bench import get_method
from elastic_bench.baselines.oracle import block_mass, block_pairs, top_blocks
from elastic_bench.kernels import HeadPlan, causal_pairs, hybrid_attention, pair_counts
from elastic_bench.modeling.interface import AttentionCall


def brute_mass(q, k, scale, bs):
    """Per query head, each query's causal softmax over the keys (float64, one query at a time), summed per block."""
    B, Hq, Lq, _ = q.shape
    H, Lk = k.shape[1], k.shape[2]
    n = math.ceil(Lk / bs)
    mass = torch.zeros(B, Hq, n, n, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            for i in range(Lq):
                p = Lk - Lq + i
                logits = k[b, h // (Hq // H), : p + 1].double() @ q[b, h, i].double() * scale
                probs = logits.softmax(0)
                for j in range(p + 1):
                    mass[b, h, p // bs, j // bs] += probs[j]
    return mass


def brute_top(mass, q_len, k_len, bs, budget):
    """Rank every causal block of a row holding queries by mass per computed pair (ties: lower row, then column), each
    row's best first, and take the longest prefix whose pairs fit ``(1 - budget)`` of the causal pairs."""
    B, Hq, n, _ = mass.shape
    first = k_len - q_len
    queries = [sum(1 for p in range(first, k_len) if p // bs == r) for r in range(n)]
    selected = torch.zeros(B, Hq, n, n, dtype=torch.bool)
    for b in range(B):
        for h in range(Hq):
            items = []
            for r in range(n):
                row = []
                for c in range(r + 1):
                    if not queries[r]:
                        continue
                    diagonal = sum(p - r * bs + 1 for p in range(first, k_len) if p // bs == r)
                    pairs = queries[r] * bs if c < r else diagonal
                    row.append([-float(mass[b, h, r, c]) / pairs, r, c, pairs])
                if row:
                    min(row, key=lambda item: (item[0], item[2]))[0] -= 2.0  # the row's best block goes first
                items += [tuple(item) for item in row]
            used = 0
            for _, r, c, pairs in sorted(items):
                if used + pairs > (1 - budget) * causal_pairs(q_len, k_len) + 0.5:
                    break
                used += pairs
                selected[b, h, r, c] = True
    return selected


@pytest.mark.parametrize("q_len,k_len", [(70, 70), (23, 70)])
def test_block_mass_is_the_true_attention_summed_per_block(q_len, k_len):
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, q_len, 8, generator=gen), torch.randn(2, 2, k_len, 8, generator=gen)
    found = block_mass(q, k, 0.35, 16)
    assert found.shape == (2, 4, 5, 5)
    torch.testing.assert_close(found.double(), brute_mass(q, k, 0.35, 16), atol=1e-5, rtol=1e-5)
    # every query's probabilities sum to 1: a row's masses sum to its query count
    first = k_len - q_len
    counts = torch.bincount(torch.arange(first, k_len) // 16, minlength=5).double()
    torch.testing.assert_close(found.sum(-1).double(), counts.expand(2, 4, 5), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("budget", [0.0, 0.3, 0.5, 0.8, 1.0])
@pytest.mark.parametrize("q_len,k_len", [(70, 70), (23, 70)])
def test_top_blocks_are_the_brute_force_top_k_set(budget, q_len, k_len):
    gen = torch.Generator().manual_seed(1)
    mass = brute_mass(torch.randn(1, 4, q_len, 8, generator=gen), torch.randn(1, 2, k_len, 8, generator=gen), 0.5, 16)
    selected = top_blocks(mass.float(), q_len, k_len, 16, budget)
    assert torch.equal(selected, brute_top(mass.float().double(), q_len, k_len, 16, budget))
    kept = (selected.double() * block_pairs(q_len, k_len, 16)).sum((-1, -2))
    assert (kept <= (1 - budget) * causal_pairs(q_len, k_len) + 0.5).all()


def _call(q, k, v):
    module = SimpleNamespace(layer_idx=0, scaling=q.shape[-1] ** -0.5)
    return AttentionCall(module, q, k, v, sample_ids=list(range(q.shape[0])))


def test_oracle_at_budget_zero_is_dense_attention_and_its_esr_is_counted_from_its_plan():
    gen = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(1, 4, 300, 16, generator=gen), torch.randn(1, 2, 300, 16, generator=gen), \
        torch.randn(1, 2, 300, 16, generator=gen)
    dense = hybrid_attention(q, k, v, HeadPlan.full(1, 2), backend="reference")
    plan = get_method("oracle", budget=0.0, block_size=64).prefill_plan(_call(q, k, v))
    torch.testing.assert_close(hybrid_attention(q, k, v, plan, backend="reference"), dense, atol=1e-5, rtol=1e-5)
    assert pair_counts(plan, 300, 300, 4).attended.eq(causal_pairs(300, 300)).all()
    for budget in (0.3, 0.6, 0.9):
        plan = get_method("oracle", budget=budget, block_size=64).prefill_plan(_call(q, k, v))
        counts = pair_counts(plan, 300, 300, 4)
        skipped = 1 - counts.attended / counts.causal  # per KV head: the mean over its query heads
        assert (skipped >= budget - 1e-9).all() and (skipped < budget + 64 * 64 / causal_pairs(300, 300)).all()


def test_oracle_refuses_a_budget_outside_zero_one():
    with pytest.raises(ValueError, match="budget must lie in"):
        get_method("oracle", budget=1.5)
