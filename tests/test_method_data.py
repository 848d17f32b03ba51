"""Router training data: record formats, category checks, tokenisation, packing, the synthetic generator."""

from __future__ import annotations

import json

import pytest
import torch

from elastic_bench.method.data import (
    CODE_PREFIX,
    DEFAULT_TARGETS,
    SUMMARY_PREFIX,
    check_categories,
    load_examples,
    read_records,
    synthetic_records,
    to_example,
)
from elastic_bench.training.engine import TokenizedExample, pack, tokenize


def test_plain_and_official_records():
    plain = to_example({"prompt": "p", "answer": "a", "category": "robust"})
    assert (plain.prompt, plain.answer, plain.category) == ("p", "a", "robust")
    official = {"context": "CTX  ", "question": "  Q?", "answer": "A", "metadata": {"task": "Single QA"}}
    assert to_example(official).prompt == "\nQ?\n\nCTX"  # question first by default (is_prefix)
    suffix = to_example({**official, "metadata": "{'task': 'MultiHop QA', 'is_prefix': False}"})
    assert suffix.prompt == "\nCTX\n\nQ?" and suffix.category == "MultiHop QA"
    summary = to_example({**official, "metadata": {"task": "Summarization", "is_prefix": False}})
    assert summary.prompt == SUMMARY_PREFIX + "\nCTX\n\nQ?" + "\n\nSummary:"
    code = to_example({**official, "metadata": {"task": "Code"}})
    assert code.prompt.startswith(CODE_PREFIX + "\nQ?")
    with pytest.raises(ValueError, match="metadata.task"):
        to_example({"context": "c", "question": "q", "answer": "a"})
    with pytest.raises(ValueError, match="expected fields"):
        to_example({"text": "x"})


def test_unknown_categories_are_rejected_with_the_known_ones(tmp_path):
    path = tmp_path / "data.jsonl"
    rows = [{"prompt": "p", "answer": "a", "category": c} for c in ("sensitive", "retrieval")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"\['retrieval'\] have no target.*--target"):
        load_examples(path, DEFAULT_TARGETS)
    examples = load_examples(path, {"retrieval": 0.3, "sensitive": 0.7, "unused": 1.0})
    assert check_categories(examples, {"retrieval": 0.3, "sensitive": 0.7, "unused": 1.0}) == ["retrieval", "sensitive"]


def test_jsonl_and_parquet_read_the_same_records(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = synthetic_records(6, length=80)
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    pq.write_table(pa.Table.from_pylist(rows[3:]), tmp_path / "b.parquet")
    assert read_records(tmp_path) == rows
    (tmp_path / "bad.jsonl").write_text('{"prompt": 1}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_records(tmp_path / "bad.jsonl")


def test_tokenize_renders_the_chat_prompt_and_ends_answers_with_eos(tiny_models):
    from elastic_bench.tasks.base import render

    _, tokenizer = tiny_models["qwen3"]
    examples = [to_example(r) for r in synthetic_records(2, length=60)]
    tokens = tokenize(examples, tokenizer, ["sensitive", "robust"], max_tokens=10_000)
    for ex, tok in zip(examples, tokens):
        prompt = render(tokenizer, ex.prompt)
        assert tok.input_ids[: tok.prompt_len].tolist() == prompt
        assert tokenizer.decode(tok.input_ids[tok.prompt_len : -1]) == ex.answer
        assert int(tok.input_ids[-1]) == tokenizer.eos_token_id
    assert [t.category for t in tokens] == [0, 1]


def test_middle_truncation_keeps_both_ends_of_the_prompt(tiny_models):
    _, tokenizer = tiny_models["qwen3"]
    ex = to_example({"prompt": "A" * 50 + "m" * 300 + "Z" * 50, "answer": "ok", "category": "robust"})
    full = tokenize([ex], tokenizer, ["robust"], max_tokens=10_000)[0]
    cut = tokenize([ex], tokenizer, ["robust"], max_tokens=200)[0]
    assert len(cut.input_ids) == 200
    answer = full.input_ids[full.prompt_len :]
    assert torch.equal(cut.input_ids[cut.prompt_len :], answer)
    head, tail = cut.prompt_len // 2, cut.prompt_len - cut.prompt_len // 2
    assert torch.equal(cut.input_ids[:head], full.input_ids[:head])
    assert torch.equal(cut.input_ids[head : cut.prompt_len], full.input_ids[full.prompt_len - tail : full.prompt_len])
    with pytest.raises(ValueError, match="does not fit"):
        tokenize([ex], tokenizer, ["robust"], max_tokens=3)


def _sample(n: int, prompt_len: int, category: int, start: int) -> TokenizedExample:
    return TokenizedExample(torch.arange(start, start + n), prompt_len, category)


def test_packing_keeps_samples_apart():
    samples = [_sample(6, 4, 0, 100), _sample(3, 2, 1, 200), _sample(5, 1, 0, 300)]
    rows = pack(samples, pack_tokens=9, loss_tokens="all")
    assert [r.cu_seqlens.tolist() for r in rows] == [[0, 6, 9], [0, 5]]  # first fit, longest first
    row = rows[0]
    assert row.input_ids.tolist() == list(range(100, 106)) + [200, 201, 202]
    assert row.position_ids.tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2]
    assert row.prompt_lens == [4, 2] and row.categories.tolist() == [0, 1]
    # every next token inside a sample is a target; nothing crosses a sample boundary
    assert row.targets.tolist() == [101, 102, 103, 104, 105, -100, 201, 202, -100]
    answer = pack(samples, pack_tokens=9)[0]  # the default: answer tokens only
    assert answer.targets.tolist() == [-100, -100, -100, 104, 105, -100, -100, 202, -100]
    with pytest.raises(ValueError, match="exceeds pack_tokens"):
        pack(samples, pack_tokens=5)


def test_synthetic_generator_is_deterministic_and_balanced():
    a, b = synthetic_records(10, seed=3), synthetic_records(10, seed=3)
    assert a == b and a != synthetic_records(10, seed=4)
    assert [r["category"] for r in a] == ["sensitive", "robust"] * 5
    for r in a:
        if r["category"] == "sensitive":
            assert f"is {r['answer']}." in r["prompt"]
        else:
            assert r["prompt"].rstrip().endswith("REPEAT THE LAST SENTENCE.") and r["answer"] in r["prompt"]
