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

# name: (rows, head_dim, ring rows, (quantum, back) of the window start, dtype); head_dim 24 is padded in the kernel
APPEND_CASES = {
    "append_rings_and_whole_rows": (6, 16, (1, 0, 1, 0, 0, 1), (1, 4), "float32"),
    "append_block_windows_d24": (3, 24, (0, 1, 1), (4, 1), "float16"),
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


def _run_append_case(name: str, device: str = "cpu") -> dict:
    """Eight decode tokens appended by both backends (more than a ring's 5 window slots, so rings wrap): every tensor
    the append writes must agree."""
    from elastic_bench.kernels.decode import AppendRule, PackedKV, append_token

    R, D, ring, (quantum, back), dtype = APPEND_CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    sink, span = 3, 5
    lengths = [12 + 3 * r for r in range(R)]
    caps = [sink + span if ring[r] else lengths[r] + 10 for r in range(R)]
    offsets = torch.tensor([0, *caps[:-1]]).cumsum(0)
    n = sum(caps)
    streaming = torch.tensor([bool(ring[r]) or r % 3 == 1 for r in range(R)])
    rule = AppendRule(torch.tensor(ring, dtype=torch.bool, device=device), streaming.to(device), sink, span, quantum,
                      back)

    def fresh():
        kv = PackedKV(torch.zeros(n, D, dtype=getattr(torch, dtype)), torch.zeros(n, D, dtype=getattr(torch, dtype)),
                      torch.full((n,), -1, dtype=torch.int32), offsets, torch.tensor(caps, dtype=torch.int32),
                      torch.zeros(R, dtype=torch.int32), torch.zeros(R, dtype=torch.int32), max(caps))
        return dataclasses.replace(kv, **{k: v.to(device) for k, v in vars(kv).items() if torch.is_tensor(v)})

    kvs = {b: fresh() for b in ("reference", "triton")}
    newest = {b: torch.tensor(lengths, dtype=torch.int32, device=device) - 1 for b in kvs}
    for _ in range(8):
        key, value = (torch.randn(R, D, generator=gen).to(device, getattr(torch, dtype)) for _ in "kv")
        for b in kvs:
            append_token(kvs[b], key, value, newest[b], rule, backend=b)
    ref, out = kvs["reference"], kvs["triton"]
    diff = max(float((getattr(ref, f).float() - getattr(out, f).float()).abs().max())
               for f in ("keys", "values", "positions", "window_start"))
    return {"err": max(diff, float((newest["reference"] - newest["triton"]).abs().max()))}


def _run_any(name: str) -> dict:
    return _run_append_case(name) if name in APPEND_CASES else _run_case(name)


@pytest.fixture(scope="module")
def results() -> dict:
    return run_interpreted(__file__)


@pytest.mark.parametrize("name", list(CASES))
def test_triton_decode_matches_reference(results, name):
    r = results[name]
    assert "error" not in r, r.get("error")
    assert r["err"] < r["tol"], f"Triton decode differs from the reference by {r['err']}"


@pytest.mark.parametrize("name", list(APPEND_CASES))
def test_triton_append_matches_reference(results, name):
    r = results[name]
    assert "error" not in r, r.get("error")
    assert r["err"] == 0.0, f"Triton append differs from the reference by {r['err']}"


def test_reference_append_writes_rings_and_whole_rows():
    """The reference append: a whole row puts position p in slot p, a ring row wraps after its sink; window starts."""
    from elastic_bench.kernels.decode import AppendRule, PackedKV, append_token

    caps = [4, 2 + 3]  # a whole row (room for 4 tokens) and a ring of sink 2 + window 3
    kv = PackedKV(torch.zeros(9, 2), torch.zeros(9, 2), torch.full((9,), -1, dtype=torch.int32),
                  torch.tensor([0, 4]), torch.tensor(caps, dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
                  torch.zeros(2, dtype=torch.int32), 5)
    rule = AppendRule(torch.tensor([False, True]), torch.tensor([False, True]), 2, 3, 1, 2)
    newest = torch.tensor([-1, 4], dtype=torch.int32)  # the ring row already holds positions 0-4
    for t in range(3):
        append_token(kv, torch.full((2, 2), float(t)), torch.full((2, 2), -float(t)), newest, rule, backend="reference")
    assert newest.tolist() == [2, 7]
    assert kv.positions[:4].tolist() == [0, 1, 2, -1]
    assert kv.positions[4:].tolist()[2:] == [5, 6, 7]  # ring slot 2 + (p - 2) % 3 of positions 5, 6, 7
    assert kv.keys[4 + 2 + (7 - 2) % 3].tolist() == [2.0, 2.0] and kv.values[2].tolist() == [-2.0, -2.0]
    assert kv.window_start.tolist() == [0, 7 - 2]  # (p // 1 - 2) · 1 for the streaming row, 0 for the other
    with pytest.raises(ValueError, match="appends keys and values"):
        append_token(kv, torch.zeros(3, 2), torch.zeros(3, 2), newest, rule)
    with pytest.raises(ValueError, match="ring_span >= 1"):
        AppendRule(rule.ring, rule.streaming, 2, 0, 1, 2)


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
@pytest.mark.parametrize("name", list(APPEND_CASES))
def test_gpu_append_matches_reference(name):
    assert _run_append_case(name, "cuda")["err"] == 0.0


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
    print_case_results({**CASES, **APPEND_CASES}, _run_any)
