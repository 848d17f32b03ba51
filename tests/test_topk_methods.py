"""The top-k block methods (``infllm_v2``, ``moba``, ``nsa``) as registered methods: their plans hold the kernel's
selection, sparsity is counted from it, InfLLM-V2 is dense below ``dense_len``, decode steps are dense, and bad knobs
are refused in one line."""

from __future__ import annotations

import pytest
import torch

from elastic_bench import apply, get_method
from elastic_bench.kernels import Mode, pair_counts
from elastic_bench.kernels.topk import infllm_v2_select, moba_select, nsa_select
from elastic_bench.modeling.interface import AttentionCall
from elastic_bench.modeling.loading import load_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SMALL = {"infllm_v2": {"dense_len": 0, "topk": 3, "window_size": 64},
         "moba": {"chunk_size": 128, "topk": 2, "block_size": 32},
         "nsa": {"topk": 4}}


@pytest.fixture(scope="module")
def testbed():
    model, tokenizer = load_model("testbed", dtype=torch.float32, device="cpu")
    return model


def call_of(model, q, k):
    module = model.model.layers[0].self_attn
    return AttentionCall(module, q, k, torch.zeros_like(k), None, list(range(q.shape[0])))


def test_the_defaults_are_upstreams():
    infllm, moba, nsa = (get_method(n) for n in ("infllm_v2", "moba", "nsa"))
    assert (infllm.block_size, infllm.kernel_size, infllm.kernel_stride, infllm.topk, infllm.window_size,
            infllm.init_blocks, infllm.dense_len, infllm.local_blocks) == (64, 32, 16, 64, 2048, 1, 8192, 32)
    assert (moba.chunk_size, moba.topk, moba.block_size) == (4096, 12, 128)
    assert (nsa.block_size, nsa.kernel_size, nsa.kernel_stride, nsa.topk, nsa.init_blocks, nsa.local_blocks) == \
        (64, 32, 16, 16, 1, 2)


@pytest.mark.parametrize("name", list(SMALL))
def test_the_plan_holds_the_selection_and_sparsity_counts_it(testbed, name):
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 8, 600, 32, generator=gen), torch.randn(2, 2, 600, 32, generator=gen)
    method = get_method(name, **SMALL[name])
    plan = method.plan(call_of(testbed, q, k))
    assert (plan.modes == Mode.BLOCK_SPARSE).all() and plan.block_size == method.block_size
    select = {"infllm_v2": infllm_v2_select, "moba": moba_select, "nsa": nsa_select}[name]
    knobs = {"infllm_v2": dict(block_size=64, kernel_size=32, kernel_stride=16, topk=4, init_blocks=1, local_blocks=1),
             "moba": dict(block_size=32, chunk_size=128, topk=2),
             "nsa": dict(block_size=64, kernel_size=32, kernel_stride=16, topk=4, init_blocks=1, local_blocks=2)}[name]
    expected = select(q, k, **knobs)
    assert torch.equal(plan.blocks.counts, expected.counts) and torch.equal(plan.blocks.indices, expected.indices)
    counts = pair_counts(plan, 600, 600, 8)
    assert (counts.attended < counts.causal).all()  # every head skips pairs


@pytest.mark.parametrize("name", list(SMALL))
def test_a_prompt_runs_sparse_and_decodes_densely(testbed, name):
    ids = torch.randint(5, 4000, (1, 700), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), apply(get_method(name, **SMALL[name]), testbed) as handle:
        out = testbed.generate(ids, max_new_tokens=3, do_sample=False)
        stats = handle.stats()
    assert out.shape[1] == 703
    assert stats["omega_msr"] == 1.0 and 0.3 < stats["omega_esr"] < 1.0
    assert stats["kv_bytes"] == stats["kv_bytes_full"]  # decode steps attend (and keep) the whole cache


def test_infllm_v2_is_dense_below_dense_len(testbed):
    ids = torch.randint(5, 4000, (1, 300), generator=torch.Generator().manual_seed(2))
    for dense_len, msr in ((301, 0.0), (300, 1.0)):
        with torch.no_grad(), apply(get_method("infllm_v2", dense_len=dense_len, topk=2, window_size=0), testbed) as h:
            testbed(ids)
            assert h.stats()["omega_msr"] == msr


@pytest.mark.parametrize(("name", "knobs", "message"), [
    ("infllm_v2", {"topk": 1, "init_blocks": 1}, "cannot hold the 34 forced ones"),
    ("infllm_v2", {"kernel_stride": 24}, "infllm_v2.kernel_stride (24) must divide infllm_v2.block_size (64)"),
    ("infllm_v2", {"dense_len": -1}, "must be >= 0"),
    ("moba", {"block_size": 96}, "moba.block_size (96) must divide moba.chunk_size (4096)"),
    ("moba", {"topk": 0}, "moba.topk must be >= 1"),
    ("nsa", {"topk": 2, "local_blocks": 2}, "cannot hold the 3 forced ones"),
    ("nsa", {"local_blocks": 0}, "nsa.local_blocks must be >= 1"),
])
def test_bad_knobs_are_refused_in_one_line(name, knobs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        get_method(name, **knobs)


def test_labels_name_the_knobs_a_run_changed():
    from elastic_bench.reports.labels import short_label

    method = get_method("infllm_v2", dense_len=0, topk=8, window_size=256)
    assert method.label() == "infllm_v2-topk=8-window_size=256-dense_len=0"
    assert short_label(method.label(), "infllm_v2", method.options()) == "infllm_v2 (topk=8, window=256, dense=0)"
    assert get_method("moba", chunk_size=256).label() == "moba-chunk_size=256"
