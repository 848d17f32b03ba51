"""``random:llama-3.1-70b``: Llama-3.1-70B's shapes and context, checked on its config and on the meta device, never
materialised (141 GB in bf16)."""

from __future__ import annotations

import pytest
import torch

from elastic_bench.modeling.loading import load_model, resolve_model
from elastic_bench.modeling.tensor_parallel import check

SPEC = "random:llama-3.1-70b"


def test_the_preset_has_llama_3_1_70b_s_shapes_and_context():
    config = resolve_model(SPEC).config
    shapes = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size", "max_position_embeddings")
    assert {k: getattr(config, k) for k in shapes} == dict(
        num_hidden_layers=80, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
        intermediate_size=28672, vocab_size=128256, max_position_embeddings=131072)
    assert config.rope_parameters == dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                          high_freq_factor=4.0, original_max_position_embeddings=8192)
    assert resolve_model(SPEC).positions == 131072 and resolve_model(SPEC).label == "random-llama-3.1-70b"


def test_its_config_is_built_anew_each_time():
    """A config may complete the rope parameters it is given: the preset's own stay as declared."""
    resolve_model(SPEC).config.rope_parameters["factor"] = 1.0
    assert resolve_model(SPEC).config.rope_parameters["factor"] == 8.0


def test_on_the_meta_device_it_has_the_real_parameter_count():
    model, _ = load_model(SPEC, dtype=torch.bfloat16, device="meta")  # shapes only: no storage
    assert sum(p.numel() for p in model.parameters()) == 70_553_706_496
    assert not model.config.tie_word_embeddings


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_its_heads_split_over_2_4_or_8_ranks(tp):
    check(resolve_model(SPEC).config, tp, tp)  # accepted: 64 query and 8 KV heads divide
