"""A released Elastic Attention checkpoint's ``xattn_threshold`` / ``xattn_stride`` keys set the routers' XAttention."""

from __future__ import annotations

import json

import pytest

from elastic_bench.method.checkpoint import RouterConfig, load_routers
from elastic_bench.method.modes import PAPER_XA_THRESHOLD


def _released(folder, **keys):
    from safetensors.torch import save_file

    save_file(RouterConfig(2, 2, 16).build().hf_state_dict(), str(folder / "model.safetensors"))
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "hidden_size": 64, "toggle_type": "xattn", "retrieval_mode": "full", "use_softmax": True, **keys}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_the_released_threshold_and_stride_are_honoured_and_an_override_wins(tmp_path):
    folder = _released(tmp_path, xattn_threshold=0.8, xattn_stride=8)
    attention = load_routers(folder).config.attention
    assert (attention.xa_threshold, attention.xa_stride) == (0.8, 8)
    assert load_routers(folder, xa_threshold=0.95).config.attention.xa_threshold == 0.95


def test_without_the_key_the_paper_threshold_applies_and_a_bad_one_is_refused(tmp_path):
    (tmp_path / "plain").mkdir()
    assert load_routers(_released(tmp_path / "plain")).config.attention.xa_threshold == PAPER_XA_THRESHOLD
    (tmp_path / "bad").mkdir()
    with pytest.raises(ValueError, match=r"config.json: xattn_threshold must lie in \[0.0, 1.0\], got 1.5$"):
        load_routers(_released(tmp_path / "bad", xattn_threshold=1.5))  # named as the released config names it
