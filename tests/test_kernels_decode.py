"""The decode kernel over a packed cache: Triton (under ``TRITON_INTERPRET=1`` on the CPU) against the reference, and
the reference against dense masked attention."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_kernels_triton import print_case_results, run_interpreted

# name: (batch, KV heads, query heads per KV head, head_dim, slots per row, dtype)
CASES = {
    "gqa4_mixed_rows": (2, 3, 4, 16, (100, 7, 64, 130, 1, 33), "float32"),
    "mha_long_row": (1, 2, 1, 32, (700, 20), "float32"),
    "gqa8_fp16": (1, 2, 8, 64, (300, 90), "float16"),
}


def packed(B, H, D, slots, dtype, gen):
    """A random `PackedKV`: rows of the given slot counts, shuffled positions with empty slots, windows and sinks."""
    from elastic_bench.kernels.decode import PackedKV

    caps = torch.tensor(slots, dtype=torch.int32)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), caps.long().cumsum(0)[:-1]])
    positions = torch.cat([torch.randperm(int(c), generator=gen).int() - (r % 2) for r, c in enumerate(slots)])
    window = torch.tensor([(r * 7) % max(c, 1) for r, c in enumerate(slots)], dtype=torch.int32)
    sink = torch.tensor([(r * 3) % 5 for r in range(len(slots))], dtype=torch.int32)
    n = int(caps.sum())
    keys, values = (torch.randn(n, D, generator=gen).to(dtype) for _ in "kv")
    longest = max(slots)
    return PackedKV(keys, values, positions, offsets, caps, window, sink, longest,
                    sum(c > longest // 2 for c in slots))


def as_float(kv):
    """The same packed cache with fp32 keys and values (the reference's inputs)."""
    return dataclasses.replace(kv, keys=kv.keys.float(), values=kv.values.float())


def _run_case(name: str) -> dict:
    from elastic_bench.kernels.decode import decode_attention

    B, H, G, D, slots, dtype = CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    dtype = getattr(torch, dtype)
    kv = packed(B, H, D, slots, dtype, gen)
    q = torch.randn(B, H * G, 1, D, generator=gen).to(dtype)
    ref = decode_attention(q.float(), as_float(kv), backend="reference")
    out = decode_attention(q, kv, backend="triton")
    return {"err": float((out.float() - ref).abs().max()), "tol": 1e-4 if dtype == torch.float32 else 2e-2}


@pytest.fixture(scope="module")
def results() -> dict:
    return run_interpreted(__file__)


@pytest.mark.parametrize("name", list(CASES))
def test_triton_decode_matches_reference(results, name):
    r = results[name]
    assert "error" not in r, r.get("error")
    assert r["err"] < r["tol"], f"Triton decode differs from the reference by {r['err']}"


def test_reference_is_masked_dense_attention():
    """Row by row, the reference equals softmax attention over exactly the visible slots."""
    from elastic_bench.kernels.decode import decode_attention

    gen = torch.Generator().manual_seed(0)
    B, H, G, D, slots = 2, 2, 3, 8, (50, 9, 1, 40)
    kv = packed(B, H, D, slots, torch.float64, gen)
    q = torch.randn(B, H * G, 1, D, generator=gen, dtype=torch.float64)
    out = decode_attention(q, kv, backend="reference").reshape(B * H, G, D)
    for r in range(B * H):
        start, n = int(kv.offsets[r]), int(kv.slots[r])
        pos = kv.positions[start : start + n]
        visible = (pos >= 0) & ((pos >= kv.window_start[r]) | (pos < kv.sink_end[r]))
        keys, values = kv.keys[start : start + n][visible], kv.values[start : start + n][visible]
        queries = q.reshape(B * H, G, D)[r]
        expected = torch.softmax(queries @ keys.T * D**-0.5, -1) @ values if len(keys) else torch.zeros(G, D)
        torch.testing.assert_close(out[r], expected.to(out.dtype), atol=1e-6, rtol=1e-5)  # computed in fp32


def test_bad_inputs_are_refused():
    from elastic_bench.kernels.decode import decode_attention

    kv = packed(1, 2, 16, (4, 4), torch.float32, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="one query per sample"):
        decode_attention(torch.randn(1, 4, 2, 16), kv)
    with pytest.raises(ValueError, match="do not match"):
        decode_attention(torch.randn(1, 3, 1, 16), kv)


def test_splits_are_chosen_for_the_long_rows():
    """Fewer long rows get more splits each, every split a whole number of blocks covering the longest row."""
    from elastic_bench.kernels.decode.fused import BLOCK_N, _splits

    cpu = torch.device("cpu")
    assert _splits(2, 4096, cpu)[0] > _splits(8, 4096, cpu)[0] > _splits(16, 4096, cpu)[0] == 1
    for rows, max_slots in ((2, 4096), (16, 4096), (1, 100), (3, 64)):
        splits, per_split = _splits(rows, max_slots, cpu)
        assert per_split % BLOCK_N == 0 and (splits - 1) * per_split < max_slots <= splits * per_split


@pytest.mark.gpu
def test_gpu_decode_matches_reference():
    from elastic_bench.kernels.decode import decode_attention

    gen = torch.Generator().manual_seed(1)
    kv = packed(1, 8, 128, (5000, 300, 20000, 64, 5000, 300, 20000, 64), torch.bfloat16, gen)
    kv_gpu = dataclasses.replace(kv, **{k: v.cuda() for k, v in vars(kv).items() if torch.is_tensor(v)})
    q = torch.randn(1, 32, 1, 128, generator=gen).to(torch.bfloat16)
    ref = decode_attention(q.float(), as_float(kv), backend="reference")
    out = decode_attention(q.cuda(), kv_gpu, backend="triton")
    assert float((out.float().cpu() - ref).abs().max()) < 2e-2


if __name__ == "__main__":
    print_case_results(CASES, _run_case)
