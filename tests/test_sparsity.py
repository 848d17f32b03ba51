"""ΩMSR / ΩESR accounting: closed forms of method.md §7 and brute-force pair counts."""

from __future__ import annotations

import pytest
import torch

from elastic_bench.kernels import (
    BlockSelection,
    HeadPlan,
    Mode,
    SparsityMeter,
    StreamingGeometry,
    causal_pairs,
    pair_counts,
)
from elastic_bench.kernels.hybrid.masks import for_mode

BLOCK_STREAMING = StreamingGeometry(sink=128, local=2048, granularity="block")


def closed_form_block(S: int, sink_blocks: int, local_blocks: int, b: int) -> int:
    K = sink_blocks + local_blocks
    return K * b * (K * b + 1) // 2 + (S // b - K) * (b * b * (K - 1) + b * (b + 1) // 2)


@pytest.mark.parametrize(
    "S,rho", [(8192, 0.5507), (16384, 0.7587), (32768, 0.8752), (65536, 0.9366), (131072, 0.9680), (262144, 0.9839)]
)
def test_block_streaming_matches_closed_form_and_table(S, rho):
    counts = pair_counts(HeadPlan.uniform(Mode.STREAMING, 1, 1, streaming=BLOCK_STREAMING), S, S, 1)
    assert counts.causal == S * (S + 1) // 2
    assert counts.attended[0, 0] == closed_form_block(S, 1, 16, 128)
    assert round(1 - float(counts.attended[0, 0]) / counts.causal, 4) == rho


def test_block_streaming_8k_anchor():
    counts = pair_counts(HeadPlan.uniform(Mode.STREAMING, 1, 1, streaming=BLOCK_STREAMING), 8192, 8192, 1)
    assert (int(counts.attended[0, 0]), counts.causal) == (15_077_376, 33_558_528)


@pytest.mark.parametrize("S,sink,local", [(1000, 4, 64), (4096, 128, 2048), (5000, 64, 256), (300, 0, 17)])
def test_token_streaming_matches_closed_form(S, sink, local):
    geometry = StreamingGeometry(sink=sink, local=local)
    counts = pair_counts(HeadPlan.uniform(Mode.STREAMING, 1, 1, streaming=geometry), S, S, 1)
    w = sink + local
    assert counts.attended[0, 0] == w * (w + 1) // 2 + (S - w) * w
    assert counts.attended_last[0, 0] == w


def brute_force_pairs(mode, geometry, bs, table, q_len, k_len) -> int:
    q = torch.arange(k_len - q_len, k_len)[:, None]
    kv = torch.arange(k_len)[None, :]
    return int(for_mode(mode, geometry, bs, table)(q, kv).sum())


@pytest.mark.parametrize("q_len,k_len", [(70, 70), (23, 70), (1, 70), (64, 64)])
def test_every_mode_matches_brute_force_counts(q_len, k_len):
    torch.manual_seed(0)
    bs, Hq = 16, 4
    n = -(-k_len // bs)
    dense = torch.rand(1, Hq, n, n) < 0.5
    geometries = [StreamingGeometry(sink=5, local=9), StreamingGeometry(sink=16, local=40, granularity="block")]
    for geometry in geometries:
        plan = HeadPlan(
            torch.tensor([[Mode.STREAMING, Mode.BLOCK_SPARSE]], dtype=torch.uint8),
            geometry,
            BlockSelection.from_dense(dense),
            bs,
        )
        counts = pair_counts(plan, q_len, k_len, Hq)
        dense_pairs = brute_force_pairs(Mode.FULL, geometry, bs, None, q_len, k_len)
        assert counts.causal == causal_pairs(q_len, k_len) == dense_pairs
        assert counts.attended[0, 0] == brute_force_pairs(Mode.STREAMING, geometry, bs, None, q_len, k_len)
        sparse = [brute_force_pairs(Mode.BLOCK_SPARSE, geometry, bs, dense[0, hq], q_len, k_len) for hq in (2, 3)]
        assert counts.attended[0, 1] == pytest.approx(sum(sparse) / 2)
        last = [brute_force_pairs(Mode.BLOCK_SPARSE, geometry, bs, dense[0, hq], 1, k_len) for hq in (2, 3)]
        assert counts.attended_last[0, 1] == pytest.approx(sum(last) / 2)


def test_meter_msr_and_esr_of_a_mixed_plan():
    """ΩMSR is the routed fraction; ΩESR averages 1 - A/C over all (layer, head) pairs, FULL heads counting 0."""
    S, geometry = 4096, StreamingGeometry(sink=64, local=256)
    meter = SparsityMeter()
    modes = [[Mode.FULL, Mode.STREAMING, Mode.STREAMING, Mode.FULL], [Mode.STREAMING] * 4, [Mode.FULL] * 4]
    meter.new_forward()
    for layer, row in enumerate(modes):
        plan = HeadPlan(torch.tensor([row], dtype=torch.uint8), geometry)
        meter.record(layer, "prefill", [0], plan, pair_counts(plan, S, S, 8))
    (stats,) = meter.per_sample()
    assert stats["omega_msr"] == pytest.approx(6 / 12)
    w = 64 + 256
    rho = 1 - (w * (w + 1) / 2 + (S - w) * w) / (S * (S + 1) / 2)
    assert stats["omega_esr"] == pytest.approx(6 / 12 * rho)
    assert stats["omega_esr_last_row"] == pytest.approx(6 / 12 * (1 - w / S))
    assert meter.decisions().shape == (1, 3, 4)


def test_meter_sums_prefill_chunks_and_ignores_decode():
    geometry = StreamingGeometry(sink=4, local=16)
    plan = HeadPlan.uniform(Mode.STREAMING, 1, 1, streaming=geometry)
    meter = SparsityMeter()
    meter.new_forward()
    meter.record(0, "prefill", [0], plan, pair_counts(plan, 100, 100, 1))
    meter.new_forward()
    meter.record(0, "chunk", [0], plan, pair_counts(plan, 50, 150, 1))
    meter.new_forward()
    meter.record(0, "decode", [0], HeadPlan.full(1, 1), pair_counts(HeadPlan.full(1, 1), 1, 151, 1))
    (stats,) = meter.per_sample()
    attended = brute_force_pairs(Mode.STREAMING, geometry, 128, None, 150, 150)
    assert stats["omega_esr"] == pytest.approx(1 - attended / causal_pairs(150, 150))
