"""The model families beyond plain GQA decoders (issue 54): layer kinds read from the config, values narrower than keys
(MLA) and learned sinks (gpt-oss) in the kernels, every tiny family under every method (the routed layers exactly the
full softmax ones, ΩMSR / ΩESR against a count of every pair, batch 1 against a batch of four), the FLOPs ceiling,
router checkpoints over the routed layers, and the three trainers on each family."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from elastic_bench import apply, get_method
from elastic_bench.bench.prefill import seeded_gates
from elastic_bench.kernels import BlockSelection, HeadPlan, Mode, StreamingGeometry, hybrid_attention
from elastic_bench.kernels.hybrid import _BACKENDS, naive, register_backend
from elastic_bench.modeling import generation
from elastic_bench.modeling.attention import attention_modules, softmax_modules
from elastic_bench.modeling.cost import CostModel, active_expert_share
from elastic_bench.modeling.kv_cache import PackedCache, cache_keyword, returned_cache
from elastic_bench.modeling.layer_kinds import LayerKind, layer_kinds
from elastic_bench.modeling.loading import TINY_FAMILIES, load_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FAMILIES = [f for f in TINY_FAMILIES if f not in ("qwen3", "llama")]
KINDS = {  # what each tiny family's config says its layers are
    "qwen3_moe": ["full", "full"],
    "qwen3_next": ["linear", "full", "linear", "full"],
    "qwen3_5_text": ["linear", "full", "linear", "full"],
    "gemma3_text": ["sliding", "full", "sliding"],
    "gpt_oss": ["sliding", "full"],
    "deepseek_v3": ["mla", "mla"],
}
WINDOW = 64  # the tiny sliding-window families' window
# the slower tests take one family per layout: Qwen3.5 lays its layers out as Qwen3-Next, and Qwen3-MoE's layers are
# Qwen3's (its MoE changes the cost model only, and runs once through `run`)
LAYOUTS = [f for f in FAMILIES if f != "qwen3_5_text"]
TRAINED = [f for f in LAYOUTS if f != "qwen3_moe"]


@pytest.fixture(scope="module")
def families():
    """Each tiny family's (model, tokenizer), loaded once, in fp32 on the CPU."""
    loaded = {}

    def get(family: str):
        if family not in loaded:
            loaded[family] = load_model(f"tiny:{family}", dtype=torch.float32, device="cpu")
        return loaded[family]

    return get


def prompts(tokenizer, lengths=(240,)) -> list[list[int]]:
    text = "the quick brown fox jumps over the lazy dog while seven wizards quietly hex the jury box "
    ids = tokenizer(text * 8).input_ids
    return [ids[i : i + n] for i, n in enumerate(lengths)]


# ---- kernels --------------------------------------------------------------------------------------------------------


def _plans(B: int, H: int, Hq: int, L: int) -> dict[str, HeadPlan]:
    gen = torch.Generator().manual_seed(0)
    n = -(-L // 32)
    table = torch.rand(B, Hq, n, n, generator=gen) < 0.5
    table |= torch.eye(n, dtype=torch.bool)
    modes = torch.tensor([[Mode.FULL, Mode.STREAMING], [Mode.BLOCK_SPARSE, Mode.STREAMING]], dtype=torch.uint8)
    return {
        "full": HeadPlan.full(B, H),
        "mixed": HeadPlan(modes, StreamingGeometry(sink=8, local=40), BlockSelection.from_dense(table), 32),
        "window": HeadPlan.uniform(Mode.STREAMING, B, H, streaming=StreamingGeometry(sink=0, local=48)),
    }


def _dense_attention(q, k, v, plan: HeadPlan, scale: float, sinks=None) -> torch.Tensor:
    """Softmax attention of every (sample, query head) over the plan's mask built key by key, a sink logit appended to
    each row when given (gpt-oss's eager formula)."""
    B, Hq, L, _ = q.shape
    H, bs = k.shape[1], plan.block_size
    G = Hq // H
    out = torch.zeros(B, Hq, L, v.shape[-1])
    dense = plan.blocks.to_dense(-(-L // bs)) if plan.blocks is not None else None
    for b in range(B):
        for hq in range(Hq):
            h = hq // G
            mode = Mode(int(plan.modes[b, h]))
            mask = torch.zeros(L, L, dtype=torch.bool)
            for i in range(L):
                for j in range(i + 1):
                    if mode == Mode.FULL:
                        mask[i, j] = True
                    elif mode == Mode.STREAMING:
                        g = plan.streaming
                        mask[i, j] = j < g.sink or i - j < g.local
                    else:
                        mask[i, j] = bool(dense[b, hq, i // bs, j // bs])
            scores = (q[b, hq] @ k[b, h].T * scale).masked_fill(~mask, float("-inf"))
            if sinks is not None:
                scores = torch.cat([scores, sinks[hq].expand(L, 1)], dim=1)
            weights = scores.softmax(-1)[:, :L]
            out[b, hq] = weights @ v[b, h]
    return out


@pytest.mark.parametrize("backend", ["reference", "masked"])
@pytest.mark.parametrize("plan_name", ["full", "mixed", "window"])
def test_values_narrower_than_keys_and_learned_sinks_match_attention_built_pair_by_pair(backend, plan_name):
    B, H, Hq, L, D, Dv = 2, 2, 4, 96, 24, 16  # MLA-like: keys 24 wide, values 16
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, n, L, d, generator=gen) for n, d in ((Hq, D), (H, D), (H, Dv)))
    plan, scale = _plans(B, H, Hq, L)[plan_name], D ** -0.5
    sinks = torch.randn(Hq, generator=gen)
    out = hybrid_attention(q, k, v, plan, scale=scale, backend=backend)
    assert out.shape == (B, Hq, L, Dv)
    torch.testing.assert_close(out, _dense_attention(q, k, v, plan, scale), atol=2e-5, rtol=1e-4)
    with_sinks = hybrid_attention(q, k, v, plan, scale=scale, backend=backend, sinks=sinks)
    torch.testing.assert_close(with_sinks, _dense_attention(q, k, v, plan, scale, sinks), atol=2e-5, rtol=1e-4)
    assert not torch.allclose(with_sinks, out)  # the sinks take their share of every row


def test_a_backend_without_narrow_values_gets_them_padded_and_its_output_cut_back():
    seen = []

    def equal_widths_only(q, k, v, plan, scale):
        seen.append((k.shape[-1], v.shape[-1]))
        assert k.shape[-1] == v.shape[-1]
        return naive.naive_hybrid_attention(q, k, v, plan, scale)

    register_backend("equal_widths", equal_widths_only, available=lambda device: True, priority=-1)
    try:
        gen = torch.Generator().manual_seed(2)
        q, k, v = torch.randn(1, 2, 40, 24, generator=gen), torch.randn(1, 1, 40, 24, generator=gen), torch.randn(
            1, 1, 40, 8, generator=gen)
        plan = HeadPlan.uniform(Mode.STREAMING, 1, 1, streaming=StreamingGeometry(sink=4, local=16))
        out = hybrid_attention(q, k, v, plan, backend="equal_widths")
    finally:
        del _BACKENDS["equal_widths"]
    assert seen == [(24, 24)] and out.shape == (1, 2, 40, 8)
    torch.testing.assert_close(out, hybrid_attention(q, k, v, plan, backend="reference"))


# ---- layer kinds and the glue ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_layer_kinds_come_from_the_config_and_methods_plan_the_full_layers_only(families, family):
    model, _ = families(family)
    kinds = layer_kinds(model.config)
    assert [k.kind for k in kinds] == KINDS[family]
    assert all(k.window == (WINDOW if k.kind == "sliding" else None) for k in kinds)
    assert [m.layer_idx for m in softmax_modules(model)] == [i for i, k in enumerate(kinds) if k.softmax]
    assert [m.layer_idx for m in attention_modules(model)] == [i for i, k in enumerate(kinds) if k.routable]


def test_a_layer_type_elastic_bench_does_not_know_is_refused_by_name():
    from transformers import AutoConfig

    config = AutoConfig.for_model("qwen3_next", num_hidden_layers=2, layer_types=["linear_attention", "full_attention"])
    assert layer_kinds(config) == (LayerKind("linear"), LayerKind("full"))
    config.layer_types = ["full_attention", "chunked_attention"]
    with pytest.raises(ValueError, match="layers of type chunked_attention; elastic-bench supports full_attention"):
        layer_kinds(config)


@pytest.mark.parametrize("family", FAMILIES)
def test_under_full_attention_every_family_computes_what_transformers_computes(families, family):
    model, tokenizer = families(family)
    ids = torch.tensor(prompts(tokenizer))
    with torch.no_grad():
        expected = model(ids).logits
        with apply(get_method("full"), model) as handle:
            found = model(ids).logits
    torch.testing.assert_close(found, expected, atol=1e-4, rtol=1e-4)  # windows, sinks and MLA as the model has them
    window = [k for k in layer_kinds(model.config) if k.kind == "sliding"]
    assert (handle.stats()["omega_esr_model"] > 0) == bool(window)  # a window's pairs: the model's own


METHODS = {
    "full": {},
    "streaming": {"sink": 8, "local": 48, "sparse_decode": True},
    "duo_attention": {"sink": 8, "local": 48},
    "prulong": {"sink": 8, "local": 48},
    "xattention": {"block_size": 32, "stride": 8},
    "elastic": {"router": "untrained", "sink": 8, "local": 48, "granularity": "token", "sparse_decode": True},
}


def _method(name: str, model, folder):
    options = dict(METHODS[name])
    if name in ("duo_attention", "prulong"):
        layers = len(attention_modules(model))
        options["pattern"] = str(seeded_gates(layers, model.config.num_key_value_heads, 0, folder))
    return get_method(name, **options)


class PlanLog:
    """The plans a method makes at prefill, by layer (a wrapper of its ``plan``)."""

    def __init__(self, method):
        self.method, self.inner, self.plans = method, method.plan, {}
        method.plan = self

    def __call__(self, call):
        plan = self.inner(call)
        if call.phase == "prefill":
            self.plans[call.layer_idx] = plan
        return plan


def _kept(plan: HeadPlan, h: int, G: int, L: int) -> float:
    """Pairs KV head ``h`` (sample 0) computes over an ``L``-token prompt, counted pair by pair (the mean over its
    query heads for BLOCK_SPARSE)."""
    mode, bs, g = Mode(int(plan.modes[0, h])), plan.block_size, plan.streaming
    i, j = np.tril_indices(L)
    if mode == Mode.FULL:
        return float(len(i))
    if mode == Mode.STREAMING:
        if g.granularity == "token":
            return float(((j < g.sink) | (i - j < g.local)).sum())
        sink_blocks, local_blocks = -(-g.sink // bs), -(-g.local // bs)
        return float(((j // bs < sink_blocks) | (i // bs - j // bs < local_blocks)).sum())
    table = plan.blocks.to_dense(-(-L // bs))[0].numpy()
    return float(np.mean([table[hq][i // bs, j // bs].sum() for hq in range(h * G, (h + 1) * G)]))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_method_plans_the_softmax_layers_and_its_sparsity_is_the_count_of_every_pair(families, family,
                                                                                          tmp_path):
    model, tokenizer = families(family)
    kinds = layer_kinds(model.config)
    routed = [i for i, k in enumerate(kinds) if k.routable]
    (prompt,) = prompts(tokenizer)
    L, causal = len(prompt), len(prompt) * (len(prompt) + 1) / 2
    for name in METHODS:
        method = _method(name, model, tmp_path)
        log = PlanLog(method)
        with torch.no_grad(), apply(method, model) as handle:
            model(torch.tensor([prompt]))
            stats, decisions = handle.stats(), handle.decisions()
        assert sorted(log.plans) == routed == stats["routed_layers"], name  # no window, no linear layer planned
        H = model.config.num_key_value_heads
        G = model.config.num_attention_heads // H
        assert decisions.shape == (1, len(routed), H)
        assert decisions[0].tolist() == [log.plans[i].modes[0].tolist() for i in routed]
        method_skipped, model_skipped = [], []
        for i, kind in enumerate(kinds):
            if not kind.softmax:
                continue
            for h in range(H):
                if kind.routable:
                    method_skipped.append(1 - _kept(log.plans[i], h, G, L) / causal)
                    model_skipped.append(0.0)
                else:
                    window = float(((lambda a, b: a - b < kind.window)(*np.tril_indices(L))).sum())
                    method_skipped.append(0.0)
                    model_skipped.append(1 - window / causal)
        msr = np.mean([int(log.plans[i].modes[0, h]) != Mode.FULL for i in routed for h in range(H)])
        assert stats["omega_msr"] == pytest.approx(msr), name
        assert stats["omega_esr"] == pytest.approx(np.mean(method_skipped)), name
        assert stats["omega_esr_model"] == pytest.approx(np.mean(model_skipped)), name
        assert (stats["ceiling"] > 1) == (stats["omega_esr"] > 0), name


@pytest.mark.parametrize("family", FAMILIES)
def test_a_batch_of_four_gives_every_prompt_its_batch_1_results(families, family, tmp_path):
    model, tokenizer = families(family)
    batch = prompts(tokenizer, (240, 210, 180, 150))
    method, stops = _method("duo_attention", model, tmp_path), {tokenizer.eos_token_id}
    with torch.no_grad(), apply(method, model) as handle:
        alone = []
        for prompt in batch:
            handle.reset()
            row = generation.greedy_generate(model, prompt, 4, stops)
            alone.append((row.tokens, row.kv_bytes, handle.stats()["per_sample"][0], handle.decisions()[0].tolist()))
        handle.reset()
        rows = generation.generate(model, batch, [4] * 4, [stops] * 4).rows
        stats, decisions = handle.stats(), handle.decisions()
    together = [(r.tokens, r.kv_bytes, stats["per_sample"][i], decisions[i].tolist()) for i, r in enumerate(rows)]
    assert together == alone


def test_decode_graphs_refuse_a_model_whose_layers_are_not_all_packed(families):
    model, tokenizer = families("qwen3_next")
    (prompt,) = prompts(tokenizer, (80,))
    with torch.no_grad(), apply(get_method("full"), model):
        out = model(input_ids=torch.tensor([prompt]), use_cache=True,
                    **{cache_keyword(model): generation.empty_cache(model)})
    with pytest.raises(ValueError, match="every layer is packed; this model has layers that are not"):
        PackedCache(row_slots=128, rows=2).add_sample(returned_cache(out))


# ---- the cost model -------------------------------------------------------------------------------------------------


def test_the_cost_model_counts_the_active_experts_and_the_ceiling_follows_from_the_plans(families):
    model, tokenizer = families("qwen3_moe")
    config = model.config
    assert active_expert_share(config) == 0.5  # 2 of 4 experts
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    embeddings = model.get_input_embeddings().weight.numel()
    cost = CostModel.of(model)
    total = sum(p.numel() for p in model.parameters())
    assert cost.per_token == 2 * (total - embeddings - experts / 2)
    assert cost.per_prompt == 2 * config.hidden_size * config.vocab_size
    (prompt,) = prompts(tokenizer)
    with torch.no_grad(), apply(get_method("streaming", sink=8, local=48), model) as handle:
        model(torch.tensor([prompt]))
    sample = handle.meter.per_sample()[0]
    L, dims = len(prompt), 2 * (config.head_dim + config.head_dim) * config.num_attention_heads
    full_attention = len(attention_modules(model)) * dims * L * (L + 1) / 2
    assert sample["attention_flops_full"] == pytest.approx(full_attention)
    rest = cost.rest(L)
    expected = (rest + full_attention) / (rest + full_attention * sample["attention_share"])
    assert handle.stats()["ceiling"] == pytest.approx(expected)
    assert sample["attention_share"] == pytest.approx(1 - handle.stats()["omega_esr"])  # full layers alone


# ---- router checkpoints and the trainers ----------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_train_router_runs_two_steps_on_the_routed_layers(family, tmp_path, families):
    from elastic_bench.method.checkpoint import load_routers
    from elastic_bench.method.modes import ModeConfig
    from elastic_bench.method.trainer import RouterTrainConfig, train
    from elastic_bench.training.engine import RunOptions

    model, tokenizer = families(family)
    routed = [m.layer_idx for m in attention_modules(model)]
    config = RouterTrainConfig(model=f"tiny:{family}", data="synthetic", steps=2, rows_per_step=1, pack_tokens=1024,
                               targets={"sensitive": 0.3, "robust": 1.0}, synthetic_samples=4, synthetic_length=250,
                               attention=ModeConfig(sink=4, local=32, granularity="token"), eval_samples=1,
                               device="cpu")
    result = train(config, RunOptions(output=str(tmp_path / "router"), progress=False), loaded=(model, tokenizer))
    assert len(result.log) == 2 and result.routers.config.routed_layers == routed
    saved = json.loads((tmp_path / "router" / "router_config.json").read_text())
    assert saved.get("layer_ids") == (None if routed == list(range(len(routed))) else routed)
    assert load_routers(tmp_path / "router").config.routed_layers == routed
    with torch.no_grad(), apply(get_method("elastic", router=str(tmp_path / "router")), model) as handle:
        model(torch.tensor(prompts(tokenizer, (120,))))
    assert handle.decisions().shape == (1, len(routed), model.config.num_key_value_heads)


@pytest.mark.parametrize("family", TRAINED)
def test_train_duo_and_train_prulong_write_one_gate_row_per_routed_layer(family, tmp_path, families):
    from elastic_bench.baselines.training.duo import DuoTrainConfig, train_duo
    from elastic_bench.baselines.training.passkeys import PasskeyData
    from elastic_bench.baselines.training.prulong import PruLongTrainConfig, train_prulong
    from elastic_bench.training.engine import RunOptions

    model, tokenizer = families(family)
    shape = (len(attention_modules(model)), model.config.num_key_value_heads)
    data = PasskeyData(min_length=500, max_length=700, num_lengths=2, num_passkeys=1, passkey_length=4)
    gates, run = train_duo(DuoTrainConfig(model=f"tiny:{family}", data=data, steps=2, sink=16, local=64),
                           RunOptions(output=str(tmp_path / "duo"), progress=False))
    masks, _ = train_prulong(PruLongTrainConfig(model=f"tiny:{family}", data=data, steps=2, batch_size=1, sink=16,
                                                local=64, target=0.5),
                             RunOptions(output=str(tmp_path / "prulong"), progress=False))
    assert len(run.log) == 2 and gates.shape == masks.shape == shape
    with torch.no_grad(), apply(get_method("duo_attention", pattern=str(tmp_path / "duo")), model) as handle:
        model(torch.tensor(prompts(tokenizer, (120,))))
    assert handle.decisions().shape == (1, *shape)


def test_a_router_checkpoint_for_other_layers_is_refused_naming_both(families, tmp_path):
    from elastic_bench.method.checkpoint import RouterConfig, save_routers

    model, _ = families("qwen3_next")
    save_routers(RouterConfig(2, 2, 16).build(), tmp_path / "r")  # layers 0 and 1: a 2-layer model's routers
    with pytest.raises(ValueError, match=r"is for 2 layers × 2 KV heads × head_dim 16; the model routes 2 layers "
                                         r"\(layers 1, 3\)"):
        with apply(get_method("elastic", router=str(tmp_path / "r")), model):
            pass


@pytest.mark.parametrize("family", LAYOUTS)
def test_run_completes_every_method_and_records_the_layers_and_the_ceiling(family, tmp_path, families, monkeypatch):
    from elastic_bench.evaluation.runner import RunConfig, run
    from elastic_bench.reports import load_cells, summarize
    from elastic_bench.reports.tables import overview
    from elastic_bench.results.store import Cell
    from elastic_bench.tasks.ruler import FrequentWords

    monkeypatch.setattr(FrequentWords, "max_new_tokens", 4)  # answers of 4 tokens: the runner's work, not decoding
    model, _ = families(family)
    options = {name: {k: v for k, v in METHODS[name].items()} for name in METHODS}
    for name in ("duo_attention", "prulong"):
        options[name]["pattern"] = _method(name, model, tmp_path).pattern
    config = RunConfig(model=f"tiny:{family}", methods=list(METHODS), tasks=["ruler_fwe"], lengths=[512],
                       limit=1, output=str(tmp_path / "run"), method_options=options, progress=False)
    rows = run(config)
    assert [r["status"] for r in rows] == ["complete"] * len(METHODS)
    kinds = layer_kinds(model.config)
    ceilings = {}
    for method in {r["method"] for r in rows}:
        metrics = Cell(config.output, f"tiny-{family}", method, "ruler_fwe", 512).metrics()
        assert metrics["routed_layers"] == [i for i, k in enumerate(kinds) if k.routable]
        assert sum(len(v) for k, v in metrics["layer_kinds"].items() if k != "sliding_window") == len(kinds)
        assert metrics["ceiling"] >= 1.0 and 0.0 <= metrics["omega_esr_model"] < 1.0
        ceilings[method] = metrics["ceiling"]
    (comparison,) = summarize(load_cells(config.output))
    shown = overview(comparison).frame["ceiling"]  # the report's column beside the speedup
    assert {label: shown[label] for label in shown.index} == pytest.approx(
        {c.label: ceilings[c.method] for c in comparison.configs})
