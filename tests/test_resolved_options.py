"""A method records the options it left unset with the values it ran with (`Method.resolved_options`, the
``method_resolved`` of a cell's metrics.json), which the report's legend shows: an elastic router's mode and streaming
geometry."""

from __future__ import annotations

from elastic_bench import get_method


def test_elastic_records_the_geometry_its_router_set(tiny_models):
    model, _ = tiny_models["qwen3"]
    method = get_method("elastic", router="untrained", sink=4)
    assert method.resolved_options() == {}  # not set up: nothing loaded yet, nothing to tell
    method.setup(model)
    try:
        resolved = method.resolved_options()
    finally:
        method.teardown(model)
    attention = method.routers.config.attention
    assert resolved == {"mode": attention.mode, "local": attention.local, "granularity": attention.granularity,
                        "xa_threshold": attention.xa_threshold, "selector": attention.selector}  # sink was given
    assert resolved["mode"] == "fa-ssa" and resolved["local"] == 2048


def test_a_method_without_learned_defaults_records_none():
    assert get_method("streaming").resolved_options() == {}
