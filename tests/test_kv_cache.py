"""The packed KV cache: decoding with eviction equals decoding over the full cache with the streaming mask, the
storage really shrinks, and the fast decode path gives today's tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from transformers import DynamicCache

from elastic_bench import apply, get_method
from elastic_bench.kernels import HeadPlan, Mode, StreamingGeometry
from elastic_bench.modeling.generation import greedy_generate
from elastic_bench.modeling.interface import AttentionCall, Method
from elastic_bench.modeling.kv_cache import GROW, PackedCache, PackedLayer, cache_keyword, returned_cache

F, S = int(Mode.FULL), int(Mode.STREAMING)


@dataclass
class Routed(Method):
    """Per-sample modes: sample ``b`` uses ``routes[b % len(routes)]`` (one mode per KV head) in layer 0 and the
    reverse in the next layers; prefill and decode alike."""

    name: ClassVar[str] = "routed"
    routes: tuple = ((F, S), (S, F))
    sink: int = 4
    local: int = 16
    granularity: str = "token"

    def prefill_plan(self, call: AttentionCall) -> HeadPlan:
        rows = [self.routes[s % len(self.routes)] for s in call.sample_ids]
        if call.layer_idx:
            rows = [tuple(reversed(r)) for r in rows]
        modes = torch.tensor(rows, dtype=torch.uint8)
        return HeadPlan(modes, StreamingGeometry(self.sink, self.local, self.granularity), block_size=16)

    decode_plan = prefill_plan


def forced_decode(model, method, kv_cache, prompts, steps=12):
    """Logits ``[steps + 1, B, V]`` of a left-padded batch, teacher-forced with fixed tokens; and the last cache."""
    B, L = len(prompts), max(map(len, prompts))
    ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    forced = torch.arange(steps * B).view(B, steps) % 50 + 3
    logits, name, cache = [], cache_keyword(model), DynamicCache()
    with torch.no_grad(), apply(method, model, backend="reference", kv_cache=kv_cache) as handle:
        out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0),
                    use_cache=True, **{name: cache})
        logits.append(out.logits[:, -1])
        for t in range(steps):
            mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype)], 1)
            out = model(input_ids=forced[:, t : t + 1], attention_mask=mask, position_ids=mask.sum(1, keepdim=True) - 1,
                        use_cache=True, **{name: returned_cache(out)})
            logits.append(out.logits[:, -1])
    return torch.stack(logits), returned_cache(out), {**handle.stats(), "decisions": handle.decisions()}


PROMPTS = [list(range(3, 60)), list(range(10, 40))]


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("granularity", ["token", "block"])
def test_evicting_equals_the_full_cache_with_the_streaming_mask(tiny_models, arch, granularity):
    """A batch whose samples are routed differently: evicted and kept caches give the logits of transformers' cache
    attended with the streaming mask, step by step; a small window really changes them."""
    model, _ = tiny_models[arch]
    method = Routed(local=16 if granularity == "token" else 20, granularity=granularity)
    reference, dynamic, _ = forced_decode(model, method, "dynamic", PROMPTS)
    assert type(dynamic) is DynamicCache
    for kv_cache in ("full", "evicting"):
        logits, cache, _ = forced_decode(model, method, kv_cache, PROMPTS)
        assert isinstance(cache, PackedCache) and all(layer.packed is not None for layer in cache.layers)
        torch.testing.assert_close(logits, reference, atol=2e-5, rtol=1e-4)
    dense, _, _ = forced_decode(model, get_method("full"), "dynamic", PROMPTS)
    assert (dense[1:] - reference[1:]).abs().max() > 1e-3  # the window matters: the comparison can fail


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_window_covering_everything_equals_no_eviction(tiny_models, arch):
    model, _ = tiny_models[arch]
    full, _, _ = forced_decode(model, get_method("full"), "dynamic", PROMPTS)
    evicting, cache, _ = forced_decode(model, Routed(sink=0, local=200), "evicting", PROMPTS)
    torch.testing.assert_close(evicting, full, atol=2e-5, rtol=1e-4)


def test_elastic_sparse_decode_routes_samples_differently(tiny_models):
    """The router's per-prompt decisions drive eviction: two prompts routed differently, evicting = masked."""
    model, _ = tiny_models["qwen3"]
    method = get_method("elastic", router="untrained", sink=4, local=16, granularity="token", sparse_decode=True,
                        seed=3)
    prompts = [list(range(3, 80)), [7, 9, 11] * 12]
    reference, _, stats = forced_decode(model, method, "dynamic", prompts)
    assert not torch.equal(stats["decisions"][0], stats["decisions"][1])  # the two prompts are routed differently
    evicting, cache, _ = forced_decode(model, method, "evicting", prompts)
    torch.testing.assert_close(evicting, reference, atol=2e-5, rtol=1e-4)
    streaming = [layer.rule.streaming.view(2, -1) for layer in cache.layers]  # what each layer's rows evicted
    assert torch.equal(torch.stack(streaming, 1), stats["decisions"] == Mode.STREAMING)


def test_generate_uses_the_packed_cache_unchanged(tiny_models):
    model, tokenizer = tiny_models["llama"]
    ids = torch.tensor([list(range(3, 70))])
    outputs = {}
    for kv_cache in ("dynamic", "evicting"):
        with torch.no_grad(), apply(Routed(), model, backend="reference", kv_cache=kv_cache) as handle:
            outputs[kv_cache] = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
            stats = handle.stats()
    assert torch.equal(outputs["dynamic"], outputs["evicting"])
    assert stats["kv_bytes"] > 0  # generate decoded with the packed cache (a DynamicCache records no bytes)


def test_a_32k_prompt_at_half_sparsity_holds_at_most_055_of_the_bytes(tiny_models):
    """ΩMSR 0.5 (one of two KV heads streaming, sink 64 + window 256) after a 32K-token prefill of a tiny model."""
    model, _ = tiny_models["qwen3"]
    prompt = (torch.arange(32768) % 200 + 3).tolist()
    with torch.no_grad(), apply(Routed(routes=((F, S),), sink=64, local=256), model, backend="reference") as handle:
        greedy_generate(model, prompt, 3, set())
        stats = handle.stats()
    assert stats["omega_msr"] == 0.5
    assert stats["kv_bytes"] <= 0.55 * stats["kv_bytes_full"], stats


def test_rows_grow_and_rings_wrap_over_many_steps():
    """Cache level: a kept row outgrows its room and a ring wraps many times; the packed rows always hold what the
    full cache with the mask attends."""
    from elastic_bench.kernels import hybrid_attention
    from elastic_bench.kernels.decode import decode_attention

    gen = torch.Generator().manual_seed(0)
    B, H, L, D, steps = 2, 2, 40, 16, GROW + 40
    keys, values = torch.randn(B, H, L, D, generator=gen), torch.randn(B, H, L, D, generator=gen)
    plan = HeadPlan(torch.tensor([[F, S], [S, S]], dtype=torch.uint8), StreamingGeometry(3, 10))
    layer = PackedLayer()
    layer.update(keys, values)
    layer.pack(plan, [0, 5], evict=True)
    full_k, full_v = keys, values
    for _ in range(steps):
        k, v = torch.randn(B, H, 1, D, generator=gen), torch.randn(B, H, 1, D, generator=gen)
        layer.update(k, v)
        full_k, full_v = torch.cat([full_k, k], 2), torch.cat([full_v, v], 2)
    q = torch.randn(B, 4, 1, D, generator=gen)
    out = decode_attention(q, layer.packed)
    for b, start in enumerate([0, 5]):  # sample 1's first 5 tokens were padding
        expected = hybrid_attention(q[b : b + 1], full_k[b : b + 1, :, start:], full_v[b : b + 1, :, start:],
                                    plan.select([b]), backend="reference")
        torch.testing.assert_close(out[b : b + 1], expected, atol=1e-5, rtol=1e-4)
    assert layer.packed.slots.tolist() == [L + 2 * GROW, 13, 13, 13]
    assert (layer.packed.max_slots, layer.packed.long_rows) == (L + 2 * GROW, 1)  # the decode kernel's grid


def test_fast_decode_gives_todays_tokens_on_the_testbed():
    from elastic_bench import tasks
    from elastic_bench.modeling.loading import load_model

    model, tokenizer = load_model("testbed", dtype=torch.float32, device="cpu")
    samples = tasks.get("testbed_niah_single").samples(tokenizer, 1024, limit=1, seed=0)
    for name in ("full", "duo_attention"):
        for sample in samples:
            tokens = {}
            for kv_cache in ("dynamic", "evicting"):
                with torch.no_grad(), apply(get_method(name), model, backend="reference", kv_cache=kv_cache):
                    tokens[kv_cache] = greedy_generate(model, sample.input_ids, sample.max_new_tokens, set()).tokens
            assert tokens["dynamic"] == tokens["evicting"] and len(tokens["dynamic"]) > 3


def test_bad_kv_cache_and_refused_plans_are_clear(tiny_models):
    model, _ = tiny_models["qwen3"]
    with pytest.raises(ValueError, match="kv_cache must be one of evicting, full, dynamic"):
        with apply(get_method("full"), model, kv_cache="paged"):
            pass
    layer = PackedLayer()
    layer.update(torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16))
    with pytest.raises(ValueError, match="FULL and STREAMING heads only"):
        from elastic_bench.kernels import BlockSelection

        blocks = BlockSelection.from_dense(torch.ones(1, 2, 1, 1, dtype=torch.bool))
        layer.pack(HeadPlan(torch.tensor([[F, 2]], dtype=torch.uint8), blocks=blocks), [0], evict=True)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["full", "duo_attention"])
def test_decode_graphs_give_the_eager_tokens_on_the_gpu(name):
    """CUDA-graph replays of the decode step (`DecodeGraph`) give the tokens of eager steps, on the testbed."""
    from elastic_bench import tasks
    from elastic_bench.modeling.loading import load_model

    model, tokenizer = load_model("testbed", device="cuda")
    sample = tasks.get("testbed_niah_multikey").samples(tokenizer, 2048, limit=1, seed=1)[0]
    tokens = {}
    for graphs in (False, True):
        with torch.no_grad(), apply(get_method(name), model, kv_cache="evicting") as handle:
            gen = greedy_generate(model, sample.input_ids, 24, set(), 24, decode_graphs=graphs)
            tokens[graphs], stats = gen.tokens, handle.stats()
    assert tokens[True] == tokens[False] and len(tokens[True]) == 24
    assert stats["kv_bytes"] > 0


def test_reserve_and_advance_keep_the_counts():
    layer = PackedLayer()
    layer.update(torch.randn(1, 2, 10, 16), torch.randn(1, 2, 10, 16))
    layer.pack(HeadPlan(torch.tensor([[F, S]], dtype=torch.uint8), StreamingGeometry(2, 4)), [0], evict=True)
    layer.reserve(GROW + 100)
    assert layer.packed.slots.tolist() == [10 + GROW + 100, 6]
    layer.advance()
    assert layer.get_seq_length() == 11 and layer.steps == 1


def test_dropping_samples_keeps_the_others_rows_and_bytes():
    """A layer that drops samples (transformers' `batch_select_indices`) decodes the kept ones as before, and each
    sample counts the bytes a layer of that sample alone holds."""
    from elastic_bench.kernels import hybrid_attention
    from elastic_bench.kernels.decode import decode_attention

    gen = torch.Generator().manual_seed(1)
    B, H, L, D, starts = 3, 2, 30, 16, [0, 7, 3]
    keys, values = torch.randn(B, H, L, D, generator=gen), torch.randn(B, H, L, D, generator=gen)
    plan = HeadPlan(torch.tensor([[F, S], [S, S], [F, F]], dtype=torch.uint8), StreamingGeometry(2, 8))
    layer, alone = PackedLayer(), []
    layer.update(keys, values)
    layer.pack(plan, starts, evict=True)
    for b in range(B):
        single = PackedLayer()
        single.update(keys[b : b + 1, :, starts[b] :], values[b : b + 1, :, starts[b] :])
        single.pack(plan.select([b]), [0], evict=True)
        alone.append(single)
    layer.batch_select_indices(torch.tensor([2, 0]))
    full_k, full_v = keys[[2, 0]], values[[2, 0]]
    for _ in range(GROW + 3):  # the kept rows outgrow their room once
        k, v = torch.randn(2, H, 1, D, generator=gen), torch.randn(2, H, 1, D, generator=gen)
        layer.update(k, v)
        for i, b in enumerate((2, 0)):
            alone[b].update(k[i : i + 1], v[i : i + 1])
        full_k, full_v = torch.cat([full_k, k], 2), torch.cat([full_v, v], 2)
    q = torch.randn(2, 4, 1, D, generator=gen)
    out = decode_attention(q, layer.packed)
    for i, b in enumerate((2, 0)):
        expected = hybrid_attention(q[i : i + 1], full_k[i : i + 1, :, starts[b] :], full_v[i : i + 1, :, starts[b] :],
                                    plan.select([b]), backend="reference")
        torch.testing.assert_close(out[i : i + 1], expected, atol=1e-5, rtol=1e-4)
        assert layer.sample_nbytes(i) == (alone[b].nbytes(), alone[b].full_nbytes())
    assert layer.packed.num_rows == 2 * H and layer.nbytes() == alone[2].nbytes() + alone[0].nbytes()


def test_returned_cache_reads_the_deprecated_name_only_where_the_new_one_is_absent():
    from elastic_bench.modeling.kv_cache import returned_cache

    class Output(dict):  # reading `past_key_values` warns of its deprecation in transformers >= 5.24
        def get(self, key, default=None):
            assert key != "past_key_values", "the deprecated name was read"
            return super().get(key, default)

    cache = object()
    assert returned_cache(Output(cache=cache, past_key_values=cache)) is cache
    assert returned_cache({"past_key_values": cache}) is cache
