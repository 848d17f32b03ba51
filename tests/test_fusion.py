"""The decode step's small operations compiled by `fused_ops`: which modules, the same tokens, eager forwards back."""

from __future__ import annotations

import contextlib
import sys

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import DynamicCache

from elastic_bench import apply, get_method
from elastic_bench.modeling import generation
from elastic_bench.modeling.fusion import fusable_modules, fused_ops
from elastic_bench.modeling.kv_cache import cache_keyword, returned_cache


def _names(model) -> list[str]:
    names = {id(m): n for n, m in model.named_modules()}
    return [names[id(m)] for m in fusable_modules(model)]


def test_fusable_modules_are_the_attention_free_ones(tiny_models):
    llama = [f"model.layers.{i}.{part}" for i in range(2) for part in ("mlp", "input_layernorm",
                                                                        "post_attention_layernorm")]
    assert _names(tiny_models["llama"][0]) == [*llama, "model.norm", "model.rotary_emb"]
    qwen3 = [f"model.layers.{i}.{part}" for i in range(2) for part in (
        "self_attn.q_norm", "self_attn.k_norm", "mlp", "input_layernorm", "post_attention_layernorm")]
    assert _names(tiny_models["qwen3"][0]) == [*qwen3, "model.norm", "model.rotary_emb"]


def _decode(model, ids: torch.Tensor, steps: int, fused: bool) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens of ``steps`` decode steps after an eager prefill, and the last step's logits ``[1, V]``."""
    name = cache_keyword(model)
    with torch.inference_mode(), apply(get_method("streaming", sink=2, local=8, sparse_decode=True), model):
        out = model(input_ids=ids, use_cache=True, **{name: DynamicCache()})
        logits, cache, tokens = out.logits[:, -1], returned_cache(out), []
        with fused_ops(model) if fused else contextlib.nullcontext():
            for _ in range(steps):
                tokens.append(int(logits.argmax(-1)))
                out = model(input_ids=logits.argmax(-1)[:, None], use_cache=True, **{name: cache})
                logits, cache = out.logits[:, -1], returned_cache(out)
    return tokens, logits


def test_fused_decode_gives_the_eager_tokens_and_restores_the_forwards(tiny_models):
    model, _ = tiny_models["qwen3"]
    rotary = sys.modules[type(model.model.layers[0].self_attn).__module__]
    original = rotary.apply_rotary_pos_emb
    ids = torch.randint(3, 200, (1, 40), generator=torch.Generator().manual_seed(0))
    eager, eager_logits = _decode(model, ids, 6, fused=False)
    graphs = counters["stats"]["unique_graphs"]
    fused, fused_logits = _decode(model, ids, 6, fused=True)
    assert counters["stats"]["unique_graphs"] > graphs  # the steps ran compiled code
    assert fused == eager
    torch.testing.assert_close(fused_logits, eager_logits, rtol=1e-4, atol=1e-4)
    assert rotary.apply_rotary_pos_emb is original
    assert all("forward" not in m.__dict__ for m in fusable_modules(model))


def test_fused_ops_restore_the_forwards_after_an_error(tiny_models):
    model, _ = tiny_models["llama"]
    norm = model.model.norm
    with pytest.raises(RuntimeError, match="inside"):
        with fused_ops(model) as modules:
            assert norm in modules and "forward" in norm.__dict__
            raise RuntimeError("inside")
    assert "forward" not in norm.__dict__


def test_warm_up_compiles_the_decode_steps_fused_ops_only_with_decode_graphs(tiny_models, monkeypatch):
    """A run's warm-up runs its decode step inside `fused_ops` when the run decodes with graphs, so the first timed
    sample does not pay for compiling them."""
    model, _ = tiny_models["llama"]
    entered = []

    @contextlib.contextmanager
    def recording(m):
        entered.append(m)
        yield []

    monkeypatch.setattr(generation, "fused_ops", recording)
    generation.warm_up(model, list(range(3, 15)))
    assert entered == []
    generation.warm_up(model, list(range(3, 15)), decode_graphs=True)
    assert entered == [model]


def test_entering_again_compiles_nothing_new(monkeypatch):
    """Every prompt of a cell enters `fused_ops`: the compiled wrappers are made at the first entry only."""
    from elastic_bench.modeling import fusion
    from elastic_bench.modeling.loading import load_model

    model, _ = load_model("tiny:llama", device="cpu")
    made = []
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: made.append(fn) or compile_(fn, **kw))
    with fusion.fused_ops(model) as modules:
        first = [m.forward for m in modules]
    count = len(made)
    assert count >= len(modules) > 0
    with fusion.fused_ops(model) as modules:
        assert [m.forward for m in modules] == first  # the same compiled wrappers
    assert len(made) == count
    assert all("forward" not in m.__dict__ for m in modules)  # the eager forwards are back
