"""Elastic Attention with a top-k block method on its block-sparse side (FA-InfLLM, FA-MoBA, FA-NSA, MoBA-SSA): the
plan of a routing decision takes the method's own selection for the sparse heads, invalid combinations are refused
before any model loads, and a router checkpoint keeps its selector."""

from __future__ import annotations

import json

import pytest
import torch

from elastic_bench import apply, get_method
from elastic_bench.kernels import Mode
from elastic_bench.method import ModeConfig, load_routers, save_routers
from elastic_bench.modeling.loading import load_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def qk(seed=0, L=700):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, 8, L, 32, generator=gen), torch.randn(2, 2, L, 32, generator=gen)


@pytest.mark.parametrize("selector", ["infllm_v2", "moba", "nsa"])
def test_fa_xa_takes_the_selectors_blocks_for_the_sparse_heads(selector):
    q, k = qk()
    full_side = torch.tensor([[True, False], [False, False]])
    plan = ModeConfig(mode="fa-xa", selector=selector).plan(full_side, q, k)
    method = get_method(selector)
    assert plan.block_size == method.block_size
    assert plan.modes.tolist() == [[Mode.FULL, Mode.BLOCK_SPARSE], [Mode.BLOCK_SPARSE, Mode.BLOCK_SPARSE]]
    expected = method.select(q, k, heads=~full_side)
    assert torch.equal(plan.blocks.counts, expected.counts) and torch.equal(plan.blocks.indices, expected.indices)
    assert (plan.blocks.counts[0, :4] == 0).all()  # the FULL head's query heads select nothing


def test_moba_ssa_streams_with_the_modes_blocks():
    q, k = qk(1)
    plan = ModeConfig(mode="xa-ssa", selector="moba").plan(torch.tensor([[True, False]] * 2), q, k)
    assert plan.block_size == 128 and plan.modes[:, 1].eq(Mode.STREAMING).all()
    assert torch.equal(plan.blocks.counts[:, :4], get_method("moba").select(q, k).counts[:, :4])


@pytest.mark.parametrize(("mode", "selector", "message"), [
    ("fa-ssa", "infllm_v2", "fa-ssa has no block-sparse side"),
    ("xa-ssa", "infllm_v2", "selects 64-token blocks, the streaming side's are 128"),
    ("xa-ssa", "nsa", "xa-ssa takes xattention or moba"),
])
def test_invalid_combinations_are_refused_before_a_model_loads(mode, selector, message):
    with pytest.raises(ValueError, match=message):
        ModeConfig(mode=mode, selector=selector)
    with pytest.raises(ValueError, match=message):
        get_method("elastic", router="untrained", mode=mode, selector=selector)
    with pytest.raises(ValueError, match="selector must be one of xattention, infllm_v2, moba, nsa"):
        ModeConfig(selector="quest")


def test_fa_infllm_runs_on_the_testbed_and_a_checkpoint_keeps_its_selector(tmp_path):
    model, _ = load_model("testbed", dtype=torch.float32, device="cpu")
    method = get_method("elastic", router="untrained", mode="fa-xa", selector="infllm_v2")
    assert method.label() == "elastic-router=untrained-mode=fa-xa-selector=infllm_v2"
    ids = torch.randint(5, 4000, (1, 600), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), apply(method, model) as handle:
        model(ids)
        stats = handle.stats()
    assert method.routers.config.attention.selector == "infllm_v2"
    assert 0 < stats["omega_msr"] < 1  # untrained routers send heads both ways
    save_routers(method.routers, tmp_path / "router")
    assert load_routers(tmp_path / "router").config.attention.selector == "infllm_v2"
    config = tmp_path / "router" / "router_config.json"  # written before the selector existed: XAttention
    data = json.loads(config.read_text())
    del data["attention"]["selector"]
    config.write_text(json.dumps(data))
    assert load_routers(tmp_path / "router").config.attention.selector == "xattention"
    assert "selector" not in ModeConfig().to_dict()  # XAttention routers' checkpoints are written as before
