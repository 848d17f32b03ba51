"""A prefill taken apart: nested parts count their own time only, each part holds the work it marks (on a fake clock,
so a test checks which work a part counts, not how fast the machine is), decode steps and untimed handles record
nothing, and the model hooks of a prefill are gone after it."""

from __future__ import annotations

import time

import pytest
import torch
from fixtures.clock import FakeClock

from elastic_bench import apply, get_method
from elastic_bench.kernels import hybrid
from elastic_bench.kernels.hybrid.naive import naive_hybrid_attention
from elastic_bench.kernels.timing import PARTS, PartTimer, part
from elastic_bench.modeling.attention import model_parts
from elastic_bench.modeling.kv_cache import cache_keyword, returned_cache

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_nested_parts_count_their_own_time_and_add_up_to_the_outer_span(monkeypatch):
    clock = FakeClock(tick=0.0)
    monkeypatch.setattr(time, "perf_counter", clock)
    timer = PartTimer("cpu")
    with part("attention"):  # no active timer: nothing is recorded
        clock.spend(5.0)
    with timer.active():
        with part("model"):
            clock.spend(1.0)
            with part("attention"):
                clock.spend(2.0)
            clock.spend(0.5)
            with part("model"):  # a part nested in itself counts once
                clock.spend(0.25)
        with part("routing"):
            clock.spend(3.0)
    assert timer.totals() == {"model": 1.75, "attention": 2.0, "routing": 3.0}


def test_a_prefill_is_taken_apart_and_decode_steps_are_not(tiny_models, monkeypatch):
    """On a clock that advances by what a stub kernel costs, the attention part of a prefill is the kernel's time, one
    call per layer; the model's modules hold the rest; the hooks that mark them live for the prefill only."""
    model, _ = tiny_models["llama"]
    layers = model.config.num_hidden_layers
    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)

    def costly(q, k, v, plan, scale):
        clock.spend(0.25)
        return naive_hybrid_attention(q, k, v, plan, scale)

    monkeypatch.setattr(hybrid, "_BACKENDS", dict(hybrid._BACKENDS))
    hybrid.register_backend("stub_costly", costly, lambda device: device.type == "cpu", 100)
    ids = torch.randint(0, model.config.vocab_size, (1, 300))
    hooked = model_parts(model)
    assert len(hooked) > layers and all(not m._forward_hooks for m in hooked)
    with torch.inference_mode(), apply(get_method("streaming", local=64), model, backend="stub_costly",
                                       time_parts=True) as handle:
        out = model(input_ids=ids, use_cache=True)
        assert all(not m._forward_hooks and not m._forward_pre_hooks for m in hooked)  # removed after the prefill
        model(input_ids=ids[:, -1:], use_cache=True, **{cache_keyword(model): returned_cache(out)})  # a decode step
        (parts,) = handle.prefill_parts()
    assert set(parts) == set(PARTS)
    assert parts["attention"] == pytest.approx(layers * 0.25, abs=1e-3)
    assert 0 < parts["model"] < 1e-2 and parts["estimation"] == parts["planning"] == 0.0  # the model costs ticks only
    with torch.inference_mode(), apply(get_method("streaming", local=64), model) as handle:
        model(input_ids=ids, use_cache=False)
        assert handle.prefill_parts() == []  # not asked for


def test_the_estimation_and_planning_of_a_block_selection_are_parts_of_their_own(tiny_models):
    model, _ = tiny_models["llama"]
    ids = torch.randint(0, model.config.vocab_size, (1, 300))
    with torch.inference_mode(), apply(get_method("xattention"), model, time_parts=True) as handle:
        model(input_ids=ids, use_cache=False)
        model(input_ids=ids, use_cache=False)
        found = handle.prefill_parts()
    assert len(found) == 2 and all(p["estimation"] > 0 and p["planning"] > 0 and p["attention"] > 0 for p in found)


def test_a_forward_that_raises_leaves_no_hooks_behind(tiny_models):
    model, _ = tiny_models["llama"]
    failing = model.model.norm.register_forward_hook(_raise)
    try:
        with pytest.raises(RuntimeError, match="stub"), torch.inference_mode(), \
                apply(get_method("full"), model, time_parts=True):
            model(input_ids=torch.randint(0, model.config.vocab_size, (1, 64)), use_cache=False)
    finally:
        failing.remove()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model_parts(model))


def _raise(*_):
    raise RuntimeError("stub")
