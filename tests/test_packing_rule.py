"""Router training rows out of range: left out by default (the official packing), middle-truncated on request; the
final evaluation's prompts spread over the data's lengths."""

from __future__ import annotations

import json

import pytest

from elastic_bench.method.data import read_data
from elastic_bench.method.trainer import RouterTrainConfig, _data, spread
from elastic_bench.training.engine import in_range, tokenize
from elastic_bench.training.records import to_example


def _records(lengths):
    return [{"prompt": "word " * n, "answer": "ok", "category": category}
            for n, category in zip(lengths, ["sensitive", "robust"] * len(lengths))]


def test_in_range_keeps_the_samples_of_the_range_and_refuses_an_emptied_category(tiny_models):
    _, tokenizer = tiny_models["qwen3"]
    examples = [to_example(r) for r in _records([5, 5, 300, 300])]
    samples = tokenize(examples, tokenizer, ["sensitive", "robust"], max_tokens=400, truncate=False)
    assert [len(s.input_ids) > 400 for s in samples] == [False, False, True, True]  # kept whole
    assert in_range(samples, 0, 400, ["sensitive", "robust"]) == samples[:2]
    assert in_range(samples, 1000, 10_000, ["sensitive", "robust"]) == samples[2:]
    with pytest.raises(ValueError, match="no sensitive sample has 0-400 tokens .*--length-rule truncate"):
        in_range(samples[1:], 0, 400, ["sensitive", "robust"])


@pytest.mark.parametrize("rule, kept", [("drop", 2), ("truncate", 4)])
def test_the_router_trainer_drops_long_rows_unless_told_to_truncate(rule, kept, tmp_path, tiny_models):
    _, tokenizer = tiny_models["qwen3"]
    data = tmp_path / "records.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _records([5, 5, 300, 300])))
    config = RouterTrainConfig(model="tiny:qwen3", data=str(data), max_tokens=400, pack_tokens=400,
                               length_rule=rule, targets={"sensitive": 0.5, "robust": 1.0})
    _, rows, _, data, read = _data(config, tokenizer, False, ("file", data), read_data("file", data))
    assert sum(row.num_samples for row in rows) == kept
    assert all(len(row.input_ids) <= 400 for row in rows)
    assert data["records"] == kept and f"4 records read, {kept} kept" in read  # the provenance: what was trained on


def test_an_unknown_length_rule_is_refused():
    with pytest.raises(ValueError, match="length_rule must be 'drop' or 'truncate'"):
        RouterTrainConfig(length_rule="keep")


def test_spread_takes_evenly_spaced_items_first_and_last_included():
    assert spread(list(range(10)), 4) == [0, 3, 6, 9]
    assert spread(list(range(3)), 5) == [0, 1, 2]
    assert spread(list(range(5)), 1) == [0] and spread(list(range(5)), 0) == []


def test_the_final_evaluation_sees_every_length_of_the_records(tmp_path, tiny_models):
    """Records come ordered by length (`elastic-bench records`): the evaluation prompts are not the shortest ones."""
    _, tokenizer = tiny_models["qwen3"]
    data = tmp_path / "records.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in _records([10] * 6 + [50] * 6)))
    config = RouterTrainConfig(model="tiny:qwen3", data=str(data), pack_tokens=400, eval_samples=2,
                               targets={"sensitive": 0.5, "robust": 1.0})
    eval_rows = _data(config, tokenizer, False, ("file", data), read_data("file", data))[2]
    lengths = sorted(n for row in eval_rows for n in row.prompt_lens)
    assert len(lengths) == 4 and lengths[1] + 100 < lengths[2]  # per category, one short prompt and one long one
