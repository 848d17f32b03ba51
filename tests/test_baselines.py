"""DuoAttention / PruLong static gates: shipped patterns, DuoAttention's binarisation rule, plans on a model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from elastic_bench import apply, get_method
from elastic_bench.baselines.gates import PATTERNS_DIR, binarize, load_gates
from elastic_bench.kernels import Mode
from elastic_bench.modeling.loading import load_model


def test_shipped_llama_pattern_statistics():
    gates = np.clip(load_gates(PATTERNS_DIR / "Meta-Llama-3.1-8B-Instruct"), 0, 1)
    assert gates.shape == (32, 8)
    assert int((gates == 1.0).sum()) == 57 and int((gates > 0.5).sum()) == 234
    assert round(float(np.quantile(gates, 0.5)), 4) == 0.9512


@pytest.mark.parametrize("sparsity", [0.25, 0.5, 0.7])
def test_binarize_realises_the_requested_sparsity(sparsity):
    gates = load_gates(PATTERNS_DIR / "Meta-Llama-3.1-8B-Instruct")
    retrieval = binarize(gates, sparsity, seed=0)
    assert abs((1 - retrieval.mean()) - sparsity) <= 1 / 256
    assert (binarize(gates, sparsity, seed=0) == retrieval).all()


def test_ties_are_broken_by_the_seed():
    """Mistral's gates have a block of 1.0 ties around the 0.75 quantile: the noise seed picks the heads."""
    gates = load_gates(PATTERNS_DIR / "Mistral-7B-Instruct-v0.2")
    picks = {tuple(binarize(gates, 0.75, seed=s).flatten()) for s in range(4)}
    assert len(picks) > 1


def write_gates(tmp_path, gates):
    path = tmp_path / "full_attention_heads.tsv"
    np.savetxt(path, gates, delimiter="\t", fmt="%.18e")
    return path


def test_plan_follows_the_gates_on_a_model(tiny_models, tmp_path):
    model, tokenizer = tiny_models["llama"]
    path = write_gates(tmp_path, np.array([[1.0, 0.1], [0.2, 0.9]]))
    ids = tokenizer("a b c d e f g h " * 20, return_tensors="pt").input_ids
    with torch.no_grad(), apply(get_method("duo_attention", pattern=str(path), sparsity=0.5, local=16), model) as h:
        model(ids)
    assert h.decisions()[0].tolist() == [[Mode.FULL, Mode.STREAMING], [Mode.STREAMING, Mode.FULL]]
    assert h.stats()["omega_msr"] == 0.5 and h.stats()["realised_head_sparsity"] == 0.5


def test_layout_mismatch_and_missing_pattern_are_clear(tiny_models, tmp_path):
    model, _ = tiny_models["llama"]
    path = write_gates(tmp_path, np.ones((3, 2)))
    with pytest.raises(ValueError, match="3 layers × 2 KV heads; the model has 2 layers × 2 KV heads"):
        with apply(get_method("duo_attention", pattern=str(path)), model):
            pass
    with pytest.raises(FileNotFoundError, match="no head gates shipped .*DuoAttention patterns: Meta-Llama"):
        with apply(get_method("duo_attention"), model):
            pass
    with pytest.raises(FileNotFoundError, match=r"\(no prulong_gates/full_attention_heads.tsv in its directory\); pass "
                                                r"pattern"):
        with apply(get_method("prulong"), model):
            pass
    assert model.config._attn_implementation == "sdpa"
    assert not model._forward_pre_hooks  # nothing left attached by the failed setups


def test_gates_shipped_in_the_model_directory_are_found(tmp_path):
    """`pattern="auto"` takes the method's gate folder in the model directory (how the testbed ships the gates
    `train-duo` and `train-prulong` made for it), and holds its gate file alone."""
    from elastic_bench.modeling.loading import TESTBED_DIR

    model, tokenizer = load_model("testbed", device="cpu")
    ids = tokenizer("the", return_tensors="pt").input_ids.repeat(1, 300)
    for name, folder in (("duo_attention", "duo_gates"), ("prulong", "prulong_gates")):
        method = get_method(name)
        assert method.artifacts(str(TESTBED_DIR)) == {"pattern": TESTBED_DIR / folder}
        assert method.hold("pattern", TESTBED_DIR / folder, tmp_path / name).read_bytes() == (
            TESTBED_DIR / folder / "full_attention_heads.tsv").read_bytes()
        expected = binarize(load_gates(TESTBED_DIR / folder), method.sparsity)
        with torch.no_grad(), apply(method, model) as handle:
            model(ids)
        assert (handle.decisions()[0].numpy() == Mode.FULL).tolist() == expected.tolist()


def test_xattention_threshold_bounds(tiny_models):
    """τ = 1 keeps every causal block (full attention, ΩESR 0); τ = 0 keeps only the sink and diagonal blocks."""
    from elastic_bench.kernels import HeadPlan, Mode, pair_counts
    from elastic_bench.kernels.plan import BlockSelection

    model, tokenizer = tiny_models["qwen3"]
    ids = tokenizer("needle in a haystack " * 20, return_tensors="pt").input_ids  # 420 tokens, 27 blocks of 16
    with torch.no_grad():
        expected = model(ids).logits
        with apply(get_method("xattention", threshold=1.0, stride=8, block_size=16), model) as handle:
            every = model(ids).logits
        assert (every - expected).abs().max() <= 1e-4
        assert handle.stats()["omega_msr"] == 1.0 and handle.stats()["omega_esr"] == pytest.approx(0.0, abs=1e-12)
        with apply(get_method("xattention", threshold=0.0, stride=8, block_size=16), model) as handle:
            model(ids)
    L, n = ids.shape[1], -(-ids.shape[1] // 16)
    sink_and_diagonal = torch.eye(n, dtype=torch.bool)
    sink_and_diagonal[:, 0] = True
    plan = HeadPlan.uniform(Mode.BLOCK_SPARSE, 1, 1, blocks=BlockSelection.from_dense(sink_and_diagonal[None, None]),
                            block_size=16)
    counts = pair_counts(plan, L, L, 1)
    assert handle.stats()["omega_esr"] == pytest.approx(1 - float(counts.attended[0, 0]) / counts.causal)


def test_xattention_options_are_validated():
    with pytest.raises(ValueError, match="must divide"):
        get_method("xattention", stride=24)
