"""GGUF checkpoints: ``tiny:llama`` written as an F32 GGUF file the way llama.cpp's converter writes it loads back as
the same model and tokenizer, runs through ``elastic-bench run`` to the same predictions, and is labelled by its
``general.name``; the errors a user can cause are one clear message each."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from elastic_bench.modeling.loading import gguf_file, load_model, max_positions, resolve_model

gguf = pytest.importorskip("gguf", reason="the gguf package (pip install gguf) writes and reads GGUF files")

NAME = "Tiny Llama/GGUF"  # a general.name with a space and a slash, as real ones have
# HF parameter name (inside ``model.layers.N.``) → GGUF tensor name (inside ``blk.N.``), as llama.cpp names them.
LAYER_TENSORS = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def _permute(weight, n_head: int):
    """llama.cpp's q/k row order (rotary halves interleaved per head), which transformers' loader undoes."""
    return weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def _write_tokenizer(writer, tokenizer) -> None:
    """The byte-level BPE vocabulary and merges as a ``gpt2`` GGUF tokenizer, the specials marked as control tokens."""
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    tokens = sorted(tokenizer.get_vocab(), key=tokenizer.get_vocab().get)
    special = {t["content"] for t in backend["added_tokens"] if t["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in backend["model"]["merges"]])
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(tokenizer.chat_template)


def write_gguf(model, tokenizer, path, name: str | None = NAME) -> None:
    """``model`` (a Llama) and ``tokenizer`` as an F32 GGUF file at ``path``."""
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    if name:
        writer.add_name(name)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _write_tokenizer(writer, tokenizer)
    for key, param in model.state_dict().items():
        weight = param.detach().float().numpy()
        if key == "lm_head.weight":
            continue  # tied to the embedding: llama.cpp writes no output.weight then
        if key in ("model.embed_tokens.weight", "model.norm.weight"):
            writer.add_tensor({"model.embed_tokens.weight": "token_embd.weight"}.get(key, "output_norm.weight"), weight)
            continue
        _, _, layer, *rest = key.split(".")
        part = ".".join(rest[:-1])
        if part == "self_attn.q_proj":
            weight = _permute(weight, cfg.num_attention_heads)
        elif part == "self_attn.k_proj":
            weight = _permute(weight, cfg.num_key_value_heads)
        writer.add_tensor(f"blk.{layer}.{LAYER_TENSORS[part]}.weight", weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """tiny:llama (fp32) as a GGUF file, and as a transformers folder (``save_pretrained``)."""
    root = tmp_path_factory.mktemp("gguf")
    model, tokenizer = load_model("tiny:llama", dtype=torch.float32, device="cpu")
    (root / "gguf").mkdir()
    write_gguf(model, tokenizer, root / "gguf" / "tiny.gguf")
    model.save_pretrained(root / "hf")
    tokenizer.save_pretrained(root / "hf")
    return {"gguf": root / "gguf" / "tiny.gguf", "hf": root / "hf", "model": model, "tokenizer": tokenizer}


def test_gguf_loads_back_the_same_model_and_tokenizer(checkpoints):
    loaded, tokenizer = load_model(str(checkpoints["gguf"]), dtype=torch.float32, device="cpu")
    text = "The quick brown fox jumped over 12345 lazy dogs.<|im_end|> héllo ✓"
    ids = checkpoints["tokenizer"](text).input_ids
    assert tokenizer(text).input_ids == ids
    assert tokenizer.eos_token_id == checkpoints["tokenizer"].eos_token_id
    with torch.no_grad():
        expected = checkpoints["model"](torch.tensor([ids])).logits
        assert torch.allclose(loaded(torch.tensor([ids])).logits, expected, atol=1e-5)
    assert loaded.dtype == torch.float32 and loaded.config._attn_implementation == "sdpa"


def test_a_folder_of_one_gguf_file_is_that_checkpoint(checkpoints):
    folder = checkpoints["gguf"].parent
    assert gguf_file(str(folder)) == checkpoints["gguf"]
    assert resolve_model(str(folder)).path == resolve_model(str(checkpoints["gguf"])).path == str(folder)
    assert resolve_model(str(folder)).positions == checkpoints["model"].config.max_position_embeddings


def test_run_on_the_gguf_file_predicts_as_the_original(checkpoints, tmp_path):
    from elastic_bench.cli import main

    def predictions(spec: str, label: str) -> dict[str, list[str]]:
        assert resolve_model(spec).label == label
        main(["run", "--model", spec, "--methods", "full,streaming", "--tasks", "ruler_niah_single_1",
              "--lengths", "640", "--limit", "2", "--device", "cpu", "--output", str(tmp_path), "--no-progress"])
        found = {}
        for method in ("full", "streaming"):
            cell = tmp_path / label / method / "ruler_niah_single_1" / "640"
            metrics = json.loads((cell / "metrics.json").read_text())
            assert metrics["status"] == "complete"
            assert metrics["model_context"] == {"max_position_embeddings": 1 << 18,
                                                "rope": {"rope_theta": 1e6, "rope_type": "default"}}
            lines = (cell / "predictions.jsonl").read_text().splitlines()
            found[method] = [(r["id"], r["prediction"]) for r in map(json.loads, lines)]
            assert len(found[method]) == 2
        return found

    assert predictions(str(checkpoints["gguf"]), "Tiny-Llama--GGUF") == predictions(str(checkpoints["hf"]), "hf")


def test_a_gguf_without_general_name_is_labelled_by_its_file_stem(checkpoints, tmp_path):
    write_gguf(checkpoints["model"], checkpoints["tokenizer"], tmp_path / "my-model.Q8.gguf", name=None)
    file = resolve_model(str(tmp_path / "my-model.Q8.gguf"))
    assert resolve_model(str(tmp_path)).label == file.label == "my-model.Q8"


def test_user_errors_are_one_clear_message(checkpoints, tmp_path, monkeypatch):
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_text("hello")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        load_model(str(not_gguf), device="cpu")
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(checkpoints["gguf"].read_bytes())
    with pytest.raises(ValueError, match=r"2 GGUF files \(a.gguf, b.gguf\)"):
        load_model(str(two), device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json and no .gguf file"):
        load_model(str(tmp_path / "empty"), device="cpu")
    other = gguf.GGUFWriter(str(tmp_path / "other.gguf"), "no-such-arch")
    other.write_header_to_file()
    other.write_kv_data_to_file()
    other.close()
    with pytest.raises(ValueError, match="transformers cannot load the GGUF checkpoint .*other.gguf"):
        max_positions(str(tmp_path / "other.gguf"))
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if it were not installed
    with pytest.raises(ValueError, match="pip install gguf"):
        load_model(str(checkpoints["gguf"]), device="cpu")
