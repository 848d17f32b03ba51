"""``kv_bytes`` and ``kv_bytes_full`` count the same thing, the keys and values of the tokens kept: a method that
decodes densely keeps exactly a full cache's bytes (the packed rows' room for later tokens and their slot positions are
storage, not counted), and a ring row keeps at most sink + window tokens."""

from __future__ import annotations

import pytest
import torch

from elastic_bench import apply, get_method
from elastic_bench.kernels import HeadPlan, Mode, StreamingGeometry
from elastic_bench.modeling.generation import greedy_generate
from elastic_bench.modeling.kv_cache import GROW, PackedLayer

F, S = int(Mode.FULL), int(Mode.STREAMING)
H, D = 2, 8
KV_WIDTH = 2 * D * 4  # fp32 keys and values of one token in one row


def packed(prompt: int, modes: list[int], evict: bool = True) -> PackedLayer:
    """A layer packed after a ``prompt``-token prefill of one sample, one mode per KV head, sink 2 + window 8."""
    layer = PackedLayer()
    layer.update(torch.randn(1, H, prompt, D), torch.randn(1, H, prompt, D))
    layer.pack(HeadPlan(torch.tensor([modes], dtype=torch.uint8), StreamingGeometry(2, 8)), [0], evict=evict)
    return layer


@pytest.mark.parametrize("steps", [0, 3, GROW + 5])  # before, within and beyond the rows' first room
def test_dense_decode_keeps_exactly_the_full_bytes(steps):
    layer = packed(30, [F, F])
    for _ in range(steps):
        layer.update(torch.randn(1, H, 1, D), torch.randn(1, H, 1, D))
    tokens = 30 + steps
    assert layer.sample_nbytes(0) == (H * tokens * KV_WIDTH, H * tokens * KV_WIDTH)


@pytest.mark.parametrize(("prompt", "steps", "ring_tokens"), [(5, 0, 5), (5, 4, 9), (30, 0, 10), (30, 40, 10)])
def test_a_ring_keeps_at_most_sink_and_window(prompt, steps, ring_tokens):
    """One FULL head, one evicted STREAMING head (a ring of sink 2 + window 8 slots), before and after it fills."""
    layer = packed(prompt, [F, S])
    for _ in range(steps):
        layer.update(torch.randn(1, H, 1, D), torch.randn(1, H, 1, D))
    tokens = prompt + steps
    assert layer.sample_nbytes(0) == ((tokens + ring_tokens) * KV_WIDTH, H * tokens * KV_WIDTH)


def test_streaming_kept_whole_counts_every_token():
    """Without eviction a STREAMING row keeps every token (its window applied by mask): nothing is saved."""
    layer = packed(30, [F, S], evict=False)
    assert layer.sample_nbytes(0)[0] == layer.sample_nbytes(0)[1]


@pytest.mark.parametrize("kv_cache", ["evicting", "full"])
def test_full_attention_reports_the_full_bytes_at_generation(tiny_models, kv_cache):
    """A generation under ``full``: the packed cache's rows have room for GROW more tokens, yet the bytes reported
    equal a full cache's (the shipped sweep recorded 1.28x before)."""
    model, _ = tiny_models["qwen3"]
    with torch.no_grad(), apply(get_method("full"), model, backend="reference", kv_cache=kv_cache):
        gen = greedy_generate(model, list(range(3, 90)), 6, set(), min_new_tokens=6)
    assert gen.kv_bytes_full > 0 and gen.kv_bytes == gen.kv_bytes_full
