"""DuoAttention / PruLong static gates: shipped patterns, DuoAttention's binarisation rule, plans on a model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from elastic_bench import apply, methods
from elastic_bench.kernels import Mode
from elastic_bench.methods.duo_attention import PATTERNS_DIR, binarize, load_gates


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
    with torch.no_grad(), apply(methods.get("duo_attention", pattern=str(path), sparsity=0.5, local=16), model) as h:
        model(ids)
    assert h.decisions()[0].tolist() == [[Mode.FULL, Mode.STREAMING], [Mode.STREAMING, Mode.FULL]]
    assert h.stats()["omega_msr"] == 0.5 and h.stats()["realised_head_sparsity"] == 0.5


def test_layout_mismatch_and_missing_pattern_are_clear(tiny_models, tmp_path):
    model, _ = tiny_models["llama"]
    path = write_gates(tmp_path, np.ones((3, 2)))
    with pytest.raises(ValueError, match="3 layers × 2 KV heads; the model has 2 layers × 2 KV heads"):
        with apply(methods.get("duo_attention", pattern=str(path)), model):
            pass
    with pytest.raises(FileNotFoundError, match="no shipped head pattern"):
        with apply(methods.get("duo_attention"), model):
            pass
    with pytest.raises(ValueError, match="prulong needs pattern"):
        with apply(methods.get("prulong"), model):
            pass
    assert model.config._attn_implementation == "sdpa"
    assert not model._forward_pre_hooks  # nothing left attached by the failed setups
