"""Model specs: tiny random models, real-shape random presets, labels, context records, and errors."""

from __future__ import annotations

import json

import pytest
import torch

from elastic_bench.modeling.loading import load_model, model_context, resolve_model


def test_tiny_models_are_seeded_and_offline():
    (a, tok), (b, _) = load_model("tiny:qwen3", device="cpu"), load_model("tiny:qwen3", device="cpu")
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert a.config.num_key_value_heads == 2 and a.config.num_attention_heads == 4
    text = "héllo\tworld ✓"
    assert tok.decode(tok(text).input_ids) == text  # byte-level: any text round-trips


def test_random_preset_has_the_real_shape():
    model, _ = load_model("random:llama-3.1-8b", dtype=torch.bfloat16, device="meta")
    assert round(sum(p.numel() for p in model.parameters()) / 1e9, 2) == 8.03
    assert (model.config.num_hidden_layers, model.config.num_key_value_heads, model.config.head_dim) == (32, 8, 128)


@pytest.mark.parametrize("spec", ["tiny:gpt2", "random:llama-70b", "not a model"])
def test_unknown_specs_name_valid_ones(spec):
    with pytest.raises(ValueError, match="unknown model"):
        load_model(spec, device="cpu")


def test_labels_are_folder_safe():
    assert resolve_model("tiny:qwen3").label == "tiny-qwen3"
    assert resolve_model("random:llama-3.1-8b").label == "random-llama-3.1-8b"  # no ':' in a folder name
    assert resolve_model("meta-llama/Llama-3.1-8B-Instruct").label == "meta-llama--Llama-3.1-8B-Instruct"


@pytest.mark.parametrize("name_or_path, label", [
    ("org/Model-1B", "org--Model-1B"),  # the model's own name
    ("Model-1B", "Model-1B"),
    ("/scratch/run3/ckpt", "ckpt-7"),  # a path on the machine that saved it: the folder's name
    ("", "ckpt-7"),
    (None, "ckpt-7"),
])
def test_a_folder_is_labelled_by_its_config_name(tmp_path, name_or_path, label):
    folder = tmp_path / "ckpt-7"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "_name_or_path": name_or_path}))
    assert resolve_model(str(folder)).label == label


def test_the_context_record_holds_positions_and_rope(tiny_models):
    model, _ = tiny_models["llama"]
    assert model_context(model.config) == {"max_position_embeddings": 1 << 18,
                                           "rope": {"rope_theta": 1e6, "rope_type": "default"}}
