"""LongBench v1/E and LongBench-v2: shipped prompt files, loading (directory, zip, missing), truncation, chat wrapping,
generation settings, aggregation and the chain-of-thought follow-up, on generated fixtures in the official schema."""

from __future__ import annotations

import hashlib
import json
import math
import random
from importlib import resources

import pytest
from fixtures.tasks_data import build, longbench_record, write_longbench

from elastic_bench import tasks
from elastic_bench.modeling.loading import byte_tokenizer
from elastic_bench.tasks import corpora, longbench, longbench_v2

SHIPPED = {  # upstream git blob ids (reference/data/SOURCES.md)
    "longbench/dataset2prompt.json": "1c85f6bc0f0df4e42131aa49a867797ee7043ecf",
    "longbench/dataset2maxlen.json": "79d0d9990e5799c845ebcf839c1ee1a4ff14873e",
    "longbench_v2/prompts/0shot.txt": "81ad9bc1e85ad7ba5b4780fe0fa87745f4bfd964",
    "longbench_v2/prompts/0shot_cot.txt": "372d217b0d77778428092b01e93ad9a8274c366c",
    "longbench_v2/prompts/0shot_cot_ans.txt": "06318c5f9c3d4426122ab226b345aa8ce0fad471",
    "ruler/synthetic.yaml": "29cfa5f60b49a7fa53f8dccbbd4f0c7c9e7834fa",
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return build(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    def offline(repo, filename, local_only=False):
        raise ConnectionError("offline test")

    monkeypatch.setattr(corpora, "hub_download", offline)


@pytest.mark.parametrize("path, blob", SHIPPED.items())
def test_shipped_files_are_byte_exact_upstream_copies(path, blob):
    data = (resources.files("elastic_bench.tasks") / "data" / path).read_bytes()
    assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == blob


def test_registry_names_and_groups():
    assert len(tasks.GROUPS["longbench"]) == 21 and len(tasks.GROUPS["longbench_e"]) == 13
    assert tasks.GROUPS["longbench_v2"] == ["longbench_v2"] and len(tasks.GROUPS["ruler"]) == 13
    assert "longbench_repobench-p" in tasks.names() and "longbench_e_repobench-p" in tasks.names()
    assert "longbench_e_dureader" not in tasks.names()


def test_prompt_is_the_official_template_chat_wrapped(data_dir, tok):
    record = json.loads((data_dir / "longbench" / "data" / "hotpotqa.jsonl").read_text().splitlines()[0])
    sample = tasks.get("longbench_hotpotqa", data_dir=str(data_dir)).samples(tok, 8192, limit=1)[0]
    template = json.loads((resources.files("elastic_bench.tasks") / "data/longbench/dataset2prompt.json").read_text())
    expected = template["hotpotqa"].format(**record)
    assert "Question: What is the key number 0?\nAnswer:" in expected
    assert tok.decode(sample.input_ids) == f"<|im_start|>user\n{expected}<|im_end|>\n<|im_start|>assistant\n"
    assert sample.max_new_tokens == 32 and sample.references == ["answer0"]
    assert sample.metadata == {"length": 3000, "all_classes": None, "_id": "hotpotqa-0000"}


def test_skip_list_datasets_are_not_chat_wrapped_and_samsum_settings(data_dir, tok):
    samsum = tasks.get("longbench_samsum", data_dir=str(data_dir)).samples(tok, 8192)[0]
    trec = tasks.get("longbench_trec", data_dir=str(data_dir)).samples(tok, 8192)[0]
    for sample in (samsum, trec):
        assert "<|im_start|>" not in tok.decode(sample.input_ids)
    assert tok.decode(samsum.input_ids).startswith("Summarize the dialogue into a few short sentences.")
    assert samsum.max_new_tokens == 128 and samsum.min_new_tokens == 1
    assert samsum.stop_token_ids == [tok.encode("\n", add_special_tokens=False)[-1]]
    assert trec.max_new_tokens == 64 and trec.stop_token_ids == [] and trec.min_new_tokens == 0
    assert trec.metadata["all_classes"] == ["Date", "City", "Other location"]


def test_middle_truncation_keeps_half_from_each_end(tok):
    prompt = "".join(chr(ord("a") + i % 26) for i in range(1000))
    ids = tok(prompt).input_ids
    cut = longbench.middle_truncate(tok, prompt, 301)
    assert tok(cut).input_ids == ids[:150] + ids[-150:]
    assert longbench.middle_truncate(tok, prompt, 1000) == prompt
    cut2 = longbench_v2.middle_truncate(tok, prompt, 301)  # v2: ids[:m//2] + ids[-m//2:] → 150 + 151
    assert tok(cut2).input_ids == ids[:150] + ids[-151:]


def test_samples_are_truncated_to_length_minus_500_before_wrapping(data_dir, tok):
    sample = tasks.get("longbench_hotpotqa", data_dir=str(data_dir)).samples(tok, 1024, limit=1)[0]
    overhead = len(tasks.render(tok, ""))
    assert len(sample.input_ids) == 524 + overhead
    text = tok.decode(sample.input_ids)
    assert text.endswith("Question: What is the key number 0?\nAnswer:<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="too short"):
        tasks.get("longbench_hotpotqa", data_dir=str(data_dir)).samples(tok, 500)


def test_zip_laid_out_like_the_hub_gives_the_same_samples(data_dir, tmp_path, tok):
    records = [longbench_record("hotpotqa", i, 100, random.Random(i)) for i in range(3)]
    write_longbench(tmp_path / "dir", {"hotpotqa_e": records})
    write_longbench(tmp_path / "zip", {"hotpotqa_e": records}, as_zip=True)
    from_dir = tasks.get("longbench_e_hotpotqa", data_dir=str(tmp_path / "dir")).samples(tok, 2048)
    from_zip = tasks.get("longbench_e_hotpotqa", data_dir=str(tmp_path / "zip")).samples(tok, 2048)
    assert [s.input_ids for s in from_dir] == [s.input_ids for s in from_zip] and len(from_dir) == 3
    with pytest.raises(FileNotFoundError, match="has no data/qasper_e.jsonl"):
        tasks.get("longbench_e_qasper", data_dir=str(tmp_path / "zip")).samples(tok, 2048)


def test_offline_a_missing_corpus_is_one_quick_message_from_the_local_cache_alone(tmp_path, tok, monkeypatch):
    """With the hub unusable (``HF_HUB_OFFLINE``), the hub copy is looked up in the local cache only (no network, no
    retries), and the message says why."""
    from elastic_bench.results import digests

    asked = []
    monkeypatch.setattr(corpora, "hub_download", lambda repo, file, local_only=False: asked.append(local_only) or
                        (_ for _ in ()).throw(FileNotFoundError("not cached")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert digests.hub_unavailable() == "HF_HUB_OFFLINE is set"
    with pytest.raises(FileNotFoundError) as err:
        tasks.get("longbench_e_qasper", data_dir=str(tmp_path)).samples(tok, 2048)
    assert asked == [True]
    assert ("(the hub cannot be used, HF_HUB_OFFLINE is set, and its copy THUDM/LongBench/data.zip is not in the local "
            "cache): provide") in str(err.value)


def test_missing_data_names_the_file_and_where(tmp_path, tok, monkeypatch):
    monkeypatch.delenv(corpora.ENV_VAR, raising=False)
    with pytest.raises(FileNotFoundError) as err:
        tasks.get("longbench_e_qasper", data_dir=str(tmp_path)).samples(tok, 2048)
    message = str(err.value)
    assert str(tmp_path / "longbench/data/qasper_e.jsonl") in message
    assert str(tmp_path / "longbench/data.zip") in message
    assert "THUDM/LongBench/data.zip could not be fetched" in message or "is not in the local cache" in message
    with pytest.raises(FileNotFoundError, match="no data directory is set: pass --data-dir or set ELASTIC_BENCH_DATA"):
        tasks.get("longbench_v2").samples(tok, 2048)
    monkeypatch.setenv(corpora.ENV_VAR, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "longbench_v2/data.json")):
        tasks.get("longbench_v2").samples(tok, 2048)


def test_bad_record_is_a_clear_error(tmp_path, tok):
    write_longbench(tmp_path, {"hotpotqa": [{"input": "q", "answers": ["a"]}]})
    with pytest.raises(ValueError, match="record 0 lacks a LongBench field"):
        tasks.get("longbench_hotpotqa", data_dir=str(tmp_path)).samples(tok, 2048)


def test_aggregate_v1_and_e_buckets():
    v1 = tasks.get("longbench_hotpotqa")
    records = [{"score": s, "metadata": {"length": n}} for s, n in [(1.0, 10), (0.5, 3999), (0.0, 4000), (1 / 3, 9000)]]
    assert v1.aggregate(records) == {"score": round(100 * (1.0 + 0.5 + 0.0 + 1 / 3) / 4, 2)}
    e = tasks.get("longbench_e_hotpotqa").aggregate(records)
    assert e == {"score": 45.83, "score_0-4k": 75.0, "score_4-8k": 0.0, "score_8k+": 33.33}
    assert math.isnan(tasks.get("longbench_e_hotpotqa").aggregate(records[:2])["score_8k+"])
    assert [longbench.bucket(n) for n in (0, 3999, 4000, 7999, 8000)] == ["0-4k", "0-4k", "4-8k", "4-8k", "8k+"]


# ---- LongBench-v2 ------------------------------------------------------------------------------------------------


def test_v2_prompt_fill_and_chat(data_dir, tok):
    item = json.loads((data_dir / "longbench_v2" / "data.json").read_text())[0]
    sample = tasks.get("longbench_v2", data_dir=str(data_dir)).samples(tok, 65536, limit=1)[0]
    text = tok.decode(sample.input_ids)
    assert text.startswith("<|im_start|>user\nPlease read the following text and answer the question below.\n\n")
    assert f"<text>\n{item['context'].strip()}\n</text>" in text
    assert "this question: Which choice is right for item 0?\nChoices:\n(A) alpha\n(B) beta\n" in text
    assert text.endswith('"The correct answer is (insert answer here)".<|im_end|>\n<|im_start|>assistant\n')
    assert sample.max_new_tokens == 128 and sample.references == ["A"]
    assert longbench_v2.fill("$Q$ $C_A$ $COT$", {**item, "question": "$C_A$"}, cot="c") == "alpha alpha c"


def test_v2_budget_is_120k_or_the_run_length(data_dir, tok):
    task = tasks.get("longbench_v2", data_dir=str(data_dir))
    assert task.samples(tok, 200_000, limit=1)[0].metadata["budget"] == 120_000
    short = task.samples(tok, 600, limit=1)[0]
    assert short.metadata["budget"] == 600 - 128 - len(tasks.render(tok, ""))
    assert len(short.input_ids) + short.max_new_tokens <= 600


def test_v2_aggregate_breakdown_failed_and_compensated():
    def rec(prediction, answer, difficulty, length):
        score = float(longbench_v2.extract_answer(prediction.strip()) == answer)
        return {"prediction": prediction, "score": score, "metadata": {"difficulty": difficulty, "length": length}}

    records = [
        rec("The correct answer is (A)", "A", "easy", "short"),
        rec("The correct answer is (B)", "C", "hard", "medium"),
        rec("no idea", "D", "hard", "long"),
        rec("", "A", "easy", "medium"),  # a failed call
    ]
    task = longbench_v2.LongBenchV2Direct()
    assert task.aggregate(records) == {"score": 25.0, "score_easy": 50.0, "score_hard": 0.0, "score_short": 100.0,
                                       "score_medium": 0.0, "score_long": 0.0, "num_failed": 1}
    skipped = longbench_v2.LongBenchV2Direct(skip_failed=True).aggregate(records)
    assert skipped["score"] == 33.3 and skipped["score_easy"] == 100.0 and skipped["num_failed"] == 1
    compensated = longbench_v2.LongBenchV2Direct(compensated=True).aggregate(records)
    assert compensated["score"] == round(100 * (1 + 0 + 0.25 + 0.25) / 4, 1) == 37.5


def test_v2_cot_follow_up(data_dir, tok):
    task = tasks.get("longbench_v2_cot", data_dir=str(data_dir))
    first = task.samples(tok, 65536, limit=1)[0]
    assert first.max_new_tokens == 1024 and tok.decode(first.input_ids).endswith(
        "Let’s think step by step:<|im_end|>\n<|im_start|>assistant\n"
    )
    assert task.follow_up(first, "", tok) is None  # empty reasoning: a failed item
    second = task.follow_up(first, "  Because B.  ", tok)
    text = tok.decode(second.input_ids)
    assert "The text is too long and omitted here." in text and "<text>" not in text
    assert "Let’s think step by step: Because B.\n\nBased on the above" in text
    assert second.max_new_tokens == 128 and second.id == first.id
    assert task.follow_up(second, "The correct answer is (A)", tok) is None
    assert task.score("The correct answer is (A)", second) == 1.0
