"""The registered ``elastic`` method: per-sample routing, modes, decode/chunk phases, checkpoints."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from elastic_bench import apply, get_method
from elastic_bench.kernels import Mode
from elastic_bench.method import ModeConfig, RouterConfig, load_routers, save_routers
from elastic_bench.method.elastic import Elastic

SMALL = dict(sink=4, local=16, granularity="token")
NEEDS_XATTENTION = pytest.mark.skipif(
    importlib.util.find_spec("elastic_bench.kernels.xattention") is None, reason="XAttention selection not installed"
)


ALPHABETS = ["abcdefgh", "0123456789", "XYZ!?#", "qrstuvw .", "MNOPQR,;"]


def prompt(tokenizer, n_words=60, offset=0):
    """A prompt of ``n_words`` words over one of several alphabets (different alphabets route differently)."""
    letters = ALPHABETS[offset % len(ALPHABETS)]
    words = ["".join(letters[(i * 7 + j) % len(letters)] for j in range(3)) for i in range(n_words)]
    return tokenizer(" ".join(words), return_tensors="pt").input_ids


def routed(model, prompts, mode="fa-ssa", seed=0) -> Elastic:
    """An elastic method with random routers whose final bias puts each layer's median logit gap over ``prompts`` at
    zero, so that the prompts and heads are routed to both sides."""
    method = Elastic(mode=mode, seed=seed, **SMALL)
    method.routers = RouterConfig(2, 2, 16, attention=ModeConfig(mode=mode, **SMALL)).build()
    gen = torch.Generator().manual_seed(seed)
    for p in method.routers.parameters():
        torch.nn.init.normal_(p, 0.0, 0.5, generator=gen)
    gaps: dict[int, list[torch.Tensor]] = {}
    original = method.prefill_plan

    def spy(call):
        logits = method.routers[call.layer_idx](call.pre_rope_keys)
        gaps.setdefault(call.layer_idx, []).append((logits[..., 1] - logits[..., 0]).flatten())
        return original(call)

    method.prefill_plan = spy
    with torch.no_grad(), apply(method, model, backend="reference"):
        for ids in prompts:
            model(ids)
    del method.prefill_plan
    for layer, values in gaps.items():
        with torch.no_grad():
            method.routers[layer].cls_router_head_agnostic[4].bias[1] -= torch.cat(values).median()
    return method


def test_registered_with_pre_rope_keys(tmp_path):
    method = get_method("elastic", mode="fa-xa")
    assert isinstance(method, Elastic) and method.needs_pre_rope_keys
    assert method.label() == "elastic-mode=fa-xa"
    save_routers(RouterConfig(2, 2, 16).build(), tmp_path / "qwen3-8b")
    assert get_method("elastic", router=f"{tmp_path}/qwen3-8b/").label() == "elastic-router=qwen3-8b"
    assert get_method("elastic", router="untrained").label() == "elastic-router=untrained"


def test_no_router_is_refused_unless_untrained_is_asked_for(tiny_models):
    model, _ = tiny_models["qwen3"]
    with pytest.raises(ValueError, match="no router checkpoint for model .*router=untrained to run untrained"):
        with apply(get_method("elastic", **SMALL), model, backend="reference"):
            pass
    assert model.config._attn_implementation == "sdpa"


def test_untrained_routers_route_every_head(tiny_models):
    model, tokenizer = tiny_models["qwen3"]
    with torch.no_grad():
        with apply(get_method("elastic", router="untrained", **SMALL), model, backend="reference") as handle:
            model(prompt(tokenizer))
    decisions = handle.decisions()
    assert decisions.shape == (1, 2, 2)
    assert set(decisions.flatten().tolist()) <= {Mode.FULL, Mode.STREAMING}
    stats = handle.stats()
    assert stats["router_sparse_fraction"] == pytest.approx(stats["omega_msr"])


def test_each_sample_of_a_batch_is_routed_on_its_own_prompt(tiny_models):
    model, tokenizer = tiny_models["llama"]
    prompts = [prompt(tokenizer, 60, offset=o)[0] for o in range(4)] + [prompt(tokenizer, 35)[0]]
    method = routed(model, [p[None] for p in prompts])
    alone = []
    with torch.no_grad(), apply(method, model, backend="reference") as handle:
        for ids in prompts:
            handle.reset()
            logits = model(ids[None]).logits
            alone.append((handle.decisions()[0], logits))
        handle.reset()
        width = max(len(p) for p in prompts)
        batch = torch.full((len(prompts), width), tokenizer.pad_token_id)
        mask = torch.zeros_like(batch)
        for i, ids in enumerate(prompts):
            batch[i, width - len(ids) :], mask[i, width - len(ids) :] = ids, 1
        together = model(batch, attention_mask=mask).logits
        decisions = handle.decisions()
    assert len({tuple(d.flatten().tolist()) for d, _ in alone}) > 1  # the prompts are routed differently
    for i, (d, logits) in enumerate(alone):
        assert torch.equal(decisions[i], d)
        torch.testing.assert_close(together[i, width - len(prompts[i]) :], logits[0], atol=1e-4, rtol=1e-4)


def test_all_full_routing_equals_dense_attention(tiny_models):
    model, tokenizer = tiny_models["qwen3"]
    method = routed(model, [])
    for router in method.routers.layers:
        with torch.no_grad():
            router.cls_router_head_agnostic[4].bias.copy_(torch.tensor([-100.0, 100.0]))
    ids = prompt(tokenizer)
    with torch.no_grad():
        expected = model(ids).logits
        with apply(method, model, backend="reference") as handle:
            got = model(ids).logits
    assert handle.stats()["omega_msr"] == 0.0
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_decode_is_dense_and_prefill_chunks_reuse_the_first_decision(tiny_models):
    from transformers import DynamicCache

    model, tokenizer = tiny_models["qwen3"]
    ids = prompt(tokenizer, 80)
    method = routed(model, [ids[:, :100]] + [prompt(tokenizer, 30, o) for o in range(1, 5)], seed=3)
    seen = []
    original = method.plan
    method.plan = lambda call: seen.append((call.phase, original(call))) or seen[-1][1]
    with torch.no_grad(), apply(method, model, backend="reference") as handle:
        cache = DynamicCache()
        model(ids[:, :100], None, None, cache, use_cache=True)
        first = handle.decisions()[0].clone()
        model(ids[:, 100:], None, None, cache, use_cache=True)  # a second prefill chunk
        model(ids[:, -1:], None, None, cache, use_cache=True)  # a decode step
    phases = [p for p, _ in seen]
    assert phases == ["prefill"] * 2 + ["chunk"] * 2 + ["decode"] * 2
    chunk_modes = torch.stack([plan.modes[0] for p, plan in seen if p == "chunk"])
    assert torch.equal(chunk_modes, first)
    assert all(bool((plan.modes == Mode.FULL).all()) for p, plan in seen if p == "decode")


@pytest.mark.parametrize("mode, full_mode, sparse_mode", [
    ("fa-ssa", Mode.FULL, Mode.STREAMING),
    pytest.param("fa-xa", Mode.FULL, Mode.BLOCK_SPARSE, marks=NEEDS_XATTENTION),
    pytest.param("xa-ssa", Mode.BLOCK_SPARSE, Mode.STREAMING, marks=NEEDS_XATTENTION),
])
def test_modes_map_router_sides(tiny_models, mode, full_mode, sparse_mode):
    model, tokenizer = tiny_models["qwen3"]
    prompts = [prompt(tokenizer, 80, o) for o in range(5)]
    method = routed(model, prompts, mode, seed=1)
    method.routers.config.attention = ModeConfig(mode=mode, block_size=32, xa_stride=8, **SMALL)
    with torch.no_grad(), apply(method, model, backend="reference") as handle:
        for ids in prompts:
            model(ids)
    decisions = handle.decisions()
    assert set(decisions.unique().tolist()) == {full_mode, sparse_mode}  # both sides occur with these routers
    sparse_share = handle.stats()["router_sparse_fraction"]
    assert sparse_share == pytest.approx(float((decisions == sparse_mode).float().mean()))
    expected_msr = 1.0 if mode == "xa-ssa" else sparse_share
    assert handle.stats()["omega_msr"] == pytest.approx(expected_msr)


def test_save_load_gives_identical_decisions(tiny_models, tmp_path):
    model, tokenizer = tiny_models["qwen3"]
    method = routed(model, [prompt(tokenizer, 50, o) for o in range(4)], seed=2)
    save_routers(method.routers, tmp_path / "r")
    loaded = get_method("elastic", router=str(tmp_path / "r"))
    assert json.loads((tmp_path / "r" / "router_config.json").read_text())["attention"]["local"] == 16
    runs = []
    for m in (method, loaded):
        with torch.no_grad(), apply(m, model, backend="reference") as handle:
            for offset in range(4):
                model(prompt(tokenizer, 50, offset))
            runs.append(handle.decisions())
    assert torch.equal(runs[0], runs[1]) and len(set(runs[0].flatten().tolist())) == 2
    assert loaded.routers.config.attention == method.routers.config.attention  # the checkpoint's geometry


def test_released_checkpoint_layout_loads(tmp_path):
    """A released model directory: router tensors among backbone weights, PawQwen3Config keys."""
    from safetensors.torch import save_file

    bank = RouterConfig(2, 2, 16).build()
    tensors = {
        **bank.hf_state_dict(),
        "model.layers.0.self_attn.q_proj.weight": torch.zeros(4, 4),
        "model.layers.1.self_attn.attn_mask_log_alphas": torch.zeros(2),
        "model.sparsity_lambda1_task": torch.zeros(5),
    }
    save_file(tensors, str(tmp_path / "model-00001-of-00001.safetensors"))
    config = {
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_size": 64,
        "toggle_type": "xattn", "retrieval_mode": "full", "sink_size": 128, "use_softmax": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = load_routers(tmp_path, xa_threshold=0.8)
    assert loaded.config.attention == ModeConfig(mode="fa-xa", sink=128, local=1024, xa_threshold=0.8)
    for key, value in bank.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value)


def test_mismatched_layout_is_one_clear_error(tiny_models, tmp_path):
    model, _ = tiny_models["qwen3"]
    save_routers(RouterConfig(36, 8, 128, base_model="Qwen/Qwen3-8B").build(), tmp_path / "big")
    method = get_method("elastic", router=str(tmp_path / "big"))
    with pytest.raises(ValueError, match=r"36 layers × 8 KV heads × head_dim 128.*2 layers × 2 KV heads × head_dim 16"):
        with apply(method, model):
            pass
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(FileNotFoundError, match="neither"):
        load_routers(tmp_path)


def test_a_router_shipped_next_to_the_model_is_the_default(tiny_models, tmp_path):
    from elastic_bench.modeling.loading import load_model

    model, tokenizer = tiny_models["qwen3"]
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    save_routers(RouterConfig(2, 2, 16, attention=ModeConfig(mode="fa-xa")).build(), tmp_path / "elastic_router")
    local, _ = load_model(str(tmp_path), dtype=torch.float32, device="cpu")
    method = get_method("elastic")
    with apply(method, local):  # router=None: the shipped one is found, no refusal
        pass
    assert method.routers.config.attention.mode == "fa-xa"
