"""The transformers glue: golden equality with SDPA, generation with a cache, padding, packing, key capture."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from elastic_bench import apply, get_method
from elastic_bench.kernels import HeadPlan, Mode, StreamingGeometry
from elastic_bench.modeling.interface import AttentionCall, Method

ARCHS = ["qwen3", "llama"]


def prompt_ids(tokenizer, n_words=40, offset=0):
    words = " ".join(f"word{(i * 7 + offset) % 13}" for i in range(n_words))
    return tokenizer(words, return_tensors="pt").input_ids


def decode_logits(model, ids, steps=5):
    """Logits of the prefill's last position and of ``steps`` greedy decode steps with a KV cache."""
    from transformers import DynamicCache

    cache, out = DynamicCache(), []
    logits = model(ids, None, None, cache, use_cache=True).logits[:, -1]
    out.append(logits)
    for _ in range(steps):
        logits = model(logits.argmax(-1, keepdim=True), None, None, cache, use_cache=True).logits[:, -1]
        out.append(logits)
    return torch.stack(out)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("method", [get_method("full"), get_method("streaming", sink=4, local=4096)])
def test_full_coverage_equals_sdpa(tiny_models, arch, method):
    model, tokenizer = tiny_models[arch]
    ids = prompt_ids(tokenizer)
    with torch.no_grad():
        expected, expected_steps = model(ids).logits, decode_logits(model, ids)
        with apply(method, model, backend="reference"):
            got, got_steps = model(ids).logits, decode_logits(model, ids)
    assert model.config._attn_implementation == "sdpa"
    assert (got - expected).abs().max() <= 1e-4
    assert (got_steps - expected_steps).abs().max() <= 1e-4


def test_streaming_changes_logits_and_reports_sparsity(tiny_models):
    model, tokenizer = tiny_models["qwen3"]
    ids = prompt_ids(tokenizer)
    with torch.no_grad():
        expected = model(ids).logits
        with apply(get_method("streaming", sink=2, local=8), model) as handle:
            got = model(ids).logits
    assert (got - expected).abs().max() > 1e-3
    stats = handle.stats()
    assert stats["omega_msr"] == 1.0 and 0 < stats["omega_esr"] < 1
    assert handle.decisions().tolist() == [[[Mode.STREAMING] * 2] * 2]


@dataclass
class RouteByLength(Method):
    """Test method: streaming for prompts longer than ``threshold`` tokens, full otherwise; records key shapes."""

    threshold: int = 60
    needs_pre_rope_keys = True

    def __post_init__(self):
        self.seen: list[tuple[int, int]] = []

    def prefill_plan(self, call: AttentionCall) -> HeadPlan:
        self.seen.append((call.sample_ids[0], call.pre_rope_keys.shape[2]))
        mode = Mode.STREAMING if call.key.shape[2] > self.threshold else Mode.FULL
        return HeadPlan.uniform(mode, call.batch_size, call.num_kv_heads, streaming=StreamingGeometry(2, 8))


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_batch_routes_each_prompt_alone(tiny_models, arch):
    model, tokenizer = tiny_models[arch]
    short, long = prompt_ids(tokenizer, 10)[0], prompt_ids(tokenizer, 25, offset=3)[0]
    pad = tokenizer.pad_token_id
    batch = torch.full((2, len(long)), pad)
    batch[0, len(long) - len(short) :], batch[1] = short, long
    mask = (torch.arange(len(long))[None, :] >= torch.tensor([[len(long) - len(short)], [0]])).long()
    method = RouteByLength(threshold=len(short) + 1)
    with torch.no_grad(), apply(method, model) as handle:
        together = model(batch, attention_mask=mask).logits
        assert handle.stats()["num_samples"] == 2
        assert [s["omega_msr"] for s in handle.stats()["per_sample"]] == [0.0, 1.0]
        handle.reset()
        alone_short = model(short[None]).logits
        alone_long = model(long[None]).logits
    assert (together[0, -len(short) :] - alone_short[0]).abs().max() <= 1e-4
    assert (together[1] - alone_long[0]).abs().max() <= 1e-4
    assert (0, len(short)) in method.seen and (1, len(long)) in method.seen


def test_packed_sequences_are_planned_per_segment(tiny_models):
    model, tokenizer = tiny_models["llama"]
    a, b = prompt_ids(tokenizer, 12)[0], prompt_ids(tokenizer, 20, offset=5)[0]
    packed = torch.cat([a, b])[None]
    position_ids = torch.cat([torch.arange(len(a)), torch.arange(len(b))])[None]
    cu = torch.tensor([0, len(a), len(a) + len(b)], dtype=torch.int32)
    method = RouteByLength(threshold=len(a) + 1)
    with torch.no_grad(), apply(method, model) as handle:
        together = model(packed, position_ids=position_ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu).logits
        assert [s["omega_msr"] for s in handle.stats()["per_sample"]] == [0.0, 1.0]
        alone_a, alone_b = model(a[None]).logits, model(b[None]).logits
    assert (together[0, : len(a)] - alone_a[0]).abs().max() <= 1e-4
    assert (together[0, len(a) :] - alone_b[0]).abs().max() <= 1e-4


def test_pre_rope_keys_are_captured_before_rotation(tiny_models):
    model, tokenizer = tiny_models["qwen3"]
    captured = {}

    @dataclass
    class Capture(Method):
        needs_pre_rope_keys = True

        def prefill_plan(self, call):
            captured[call.layer_idx] = (call.pre_rope_keys, call.key)
            return HeadPlan.full(call.batch_size, call.num_kv_heads)

    with torch.no_grad(), apply(Capture(), model):
        model(prompt_ids(tokenizer, 8))
    pre, post = captured[0]
    assert pre.shape == post.shape  # [B, H, L, D]
    torch.testing.assert_close(pre[:, :, 0], post[:, :, 0])  # RoPE is the identity at position 0
    assert (pre[:, :, 1:] - post[:, :, 1:]).abs().max() > 1e-3


def test_apply_restores_model_after_an_error(tiny_models):
    model, tokenizer = tiny_models["llama"]
    with pytest.raises(RuntimeError, match="boom"), apply(get_method("full"), model):
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"
    assert not any(hasattr(m, "_elastic_bench_handle") for m in model.modules())
    with torch.no_grad():
        model(prompt_ids(tokenizer, 4))  # plain sdpa again, no handle needed


def test_unknown_method_and_option_name_the_closest():
    with pytest.raises(ValueError, match="did you mean streaming"):
        get_method("streeming")
    with pytest.raises(ValueError, match="did you mean local"):
        get_method("streaming", lokal=3)
