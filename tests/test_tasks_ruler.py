"""RULER: the needle-key vocabulary, length fitting for all 13 tasks with the tiny models' tokenizer, answers present
in the context, determinism, the official phrasing, and clear errors for missing corpora."""

from __future__ import annotations

import bisect
import json
import random
from pathlib import Path

import pytest
from fixtures.tasks_data import build

from elastic_bench import tasks
from elastic_bench.modeling.loading import bpe_tokenizer, byte_tokenizer
from elastic_bench.tasks import corpora, ruler, ruler_data

NEEDS_CONTEXT = {  # tasks whose references must all appear in the input ("part": at least one)
    name: ("part" if name.startswith("ruler_qa") else "all") for name in tasks.GROUPS["ruler"]
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(build(tmp_path_factory.mktemp("ruler-data")))


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("offline test")

    monkeypatch.setattr(corpora, "hub_download", offline)
    monkeypatch.setattr(corpora, "hub_rows", offline)


def test_sorted_pairs_equals_the_materialised_sorted_set():
    adjectives = ["blue", "blue-eyed", "ad hoc", "blue", "x", "x-rated", "x-rated-ish", "", "ab", "a"]
    nouns = ["eyed-cat", "cat", "dog", "contact lens", "", "cat", "rated-thing"]
    lazy = ruler_data.SortedPairs(adjectives, nouns)
    full = sorted({f"{a}-{n}" for a in adjectives for n in nouns})
    assert len(lazy) == len(full) and list(lazy) == full and lazy[-1] == full[-1] and lazy[2:5] == full[2:5]


def test_sorted_pairs_on_wonderwords_and_random_choice_identity():
    adjectives = ruler_data.wonderwords_list("adjectivelist.txt")
    nouns = ruler_data.wonderwords_list("nounlist.txt")
    nested = [a for a in adjectives if "-" in a]
    some_adjectives = adjectives[:120] + nested + [a.split("-")[0] for a in nested]
    lazy = ruler_data.SortedPairs(some_adjectives, nouns[:300])
    full = sorted({f"{a}-{n}" for a in some_adjectives for n in nouns[:300]})
    assert list(lazy) == full
    for seed in range(20):
        assert random.Random(seed).choice(lazy) == random.Random(seed).choice(full)
    words = ruler_data.needle_words()
    assert len(words) > 6_000_000 and words[0] < words[1] < words[len(words) // 2] < words[-1]
    assert "ad hoc" in adjectives and "contact lens" in nouns  # whole lines, as RULER reads them
    assert words[bisect.bisect_left(words, "ad hoc-contact lens")] == "ad hoc-contact lens"


def test_thirteen_official_configurations():
    configs = ruler.official_configs()
    assert [f"ruler_{n}" for n in configs] == tasks.GROUPS["ruler"] and len(configs) == 13
    assert tasks.get("ruler_niah_multiquery").num_keys == 4
    assert {n: tasks.get(f"ruler_{n}").max_new_tokens for n in ("niah_single_1", "vt", "cwe", "fwe", "qa_1")} == {
        "niah_single_1": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa_1": 32}


@pytest.fixture(scope="module")
def subword_tok():
    return bpe_tokenizer()


@pytest.mark.parametrize("tokenizer", ["subword", "byte"])
@pytest.mark.parametrize("name", tasks.GROUPS["ruler"])
def test_fits_length_answers_in_context_and_deterministic(name, tokenizer, data_dir, tok, subword_tok):
    """Every task at 4K with tiny:llama's subword tokenizer and with tiny:qwen3's byte-level one. cwe's smallest
    official instance (10 words × 30 plus a 40-word example) is ~6.9K bytes: beyond 4K for the byte-level tokenizer,
    so that pair is checked at 8K (and must refuse 4K with a clear message, below)."""
    tok = subword_tok if tokenizer == "subword" else tok
    length = 8192 if (name, tokenizer) == ("ruler_cwe", "byte") else 4096
    task = tasks.get(name, data_dir=data_dir)
    samples = task.samples(tok, length, limit=3, seed=7)
    assert len(samples) == 3 and len({tuple(s.input_ids) for s in samples}) == 3
    for sample in samples:
        total = len(sample.input_ids) + sample.max_new_tokens
        assert 0.9 * length <= total <= length, (name, total)
        text = tok.decode(sample.input_ids)
        found = [ref in text.split("<|im_start|>assistant")[0] for ref in sample.references]
        assert all(found) if NEEDS_CONTEXT[name] == "all" else any(found), (name, sample.references)
    again = tasks.get(name, data_dir=data_dir).samples(tok, length, limit=3, seed=7)
    assert [s.input_ids for s in again] == [s.input_ids for s in samples]
    assert [s.references for s in again] == [s.references for s in samples]
    other = tasks.get(name, data_dir=data_dir).samples(tok, length, limit=1, seed=8)[0]
    assert other.input_ids != samples[0].input_ids


def test_cwe_refuses_a_length_its_smallest_instance_exceeds(data_dir, tok):
    with pytest.raises(ValueError, match=r"ruler_cwe: a target length of 4096 tokens is too short: .* needs \d+"):
        tasks.get("ruler_cwe", data_dir=data_dir).samples(tok, 4096, limit=1)


def test_singular_phrasing_and_answer_prefix_in_the_assistant_turn(data_dir, tok):
    sample = tasks.get("ruler_niah_single_1").samples(tok, 2048, limit=1)[0]
    text = tok.decode(sample.input_ids)
    key = text.split("What is the special magic number for ")[1].split(" mentioned")[0]
    assert text.startswith("<|im_start|>user\nA special magic number is hidden within the following text.")
    assert text.endswith(f"<|im_end|>\n<|im_start|>assistant\n The special magic number for {key} mentioned in the "
                         "provided text is")
    assert f"One of the special magic numbers for {key} is: {sample.references[0]}." in text
    multi = tok.decode(tasks.get("ruler_niah_multivalue", data_dir=data_dir).samples(tok, 2048, limit=1)[0].input_ids)
    assert "What are all the special magic numbers for " in multi
    assert multi.endswith("mentioned in the provided text are")


def test_variable_tracking_example_and_chain(tok):
    sample = tasks.get("ruler_vt").samples(tok, 4096, limit=1)[0]
    text = tok.decode(sample.input_ids)
    first, second = text.split("Memorize and track the chain(s)")[1:3]
    example_answer = first.split("they are: ")[1].split("\n")[0].split()
    assert len(example_answer) == 5 and all(len(v) == 3 for v in example_answer)
    a = sample.references
    assert len(a) == 5 and all(len(v) == 5 and v.isupper() for v in a)
    assert all(f"VAR {a[i + 1]} = VAR {a[i]} " in second for i in range(4))
    value = second.split(f"VAR {a[0]} = ")[1][:5]
    assert text.endswith(f"5 variables are assigned the value {value}, they are: ")


def test_qa_uses_questions_in_order_and_caps_at_the_dataset(data_dir, tok):
    samples = tasks.get("ruler_qa_2", data_dir=data_dir).samples(tok, 4096)
    assert [s.references for s in samples] == [[f"Quuxley{i}"] for i in range(6)]
    squad = tasks.get("ruler_qa_1", data_dir=data_dir).samples(tok, 4096, limit=2)
    assert squad[0].references == ["Zorblat00", "city Zorblat00"]  # all answers of the first answerable question


def test_missing_corpora_name_the_file(tmp_path, tok):
    with pytest.raises(FileNotFoundError, match=r"Paul Graham essay.*ruler/PaulGrahamEssays.json"):
        tasks.get("ruler_niah_single_2", data_dir=str(tmp_path)).samples(tok, 4096, limit=1)
    with pytest.raises(FileNotFoundError, match=r"HotpotQA.*ruler/hotpotqa.json"):
        tasks.get("ruler_qa_2", data_dir=str(tmp_path)).samples(tok, 4096, limit=1)
    (tmp_path / "ruler").mkdir()
    (tmp_path / "ruler" / "PaulGrahamEssays.json").write_text('{"text": "One. Two."}')
    try:
        ruler_data.sentence_splitter(str(tmp_path / "nowhere"))
    except FileNotFoundError as err:
        assert "punkt_tab" in str(err) and "nltk.downloader" in str(err)
    else:
        pytest.skip("nltk's punkt model is installed on this machine")


def test_essay_shorter_than_the_haystack_is_repeated(tmp_path, data_dir, tok):
    import shutil

    shutil.copytree(f"{data_dir}/nltk_data", tmp_path / "nltk_data")
    (tmp_path / "ruler").mkdir()
    (tmp_path / "ruler" / "PaulGrahamEssays.json").write_text('{"text": "Startups grow.  Founders\\n work hard. Yes."}')
    sample = tasks.get("ruler_niah_single_2", data_dir=str(tmp_path)).samples(tok, 1024, limit=1)[0]
    assert sample.metadata["units"] > 7 and len(sample.input_ids) + 128 >= 0.9 * 1024
    assert "Yes. Startups grow. Founders work hard. Yes. Startups" in tok.decode(sample.input_ids)


def squad_rows(data: dict) -> list[dict]:
    """The rows the hub's rajpurkar/squad_v2 validation split holds for a SQuAD v2.0 JSON file."""
    return [
        {"id": qa["id"], "title": article["title"], "context": p["context"], "question": qa["question"],
         "answers": {"text": [a["text"] for a in qa["answers"]],
                     "answer_start": [a["answer_start"] for a in qa["answers"]]}}
        for article in data["data"] for p in article["paragraphs"] for qa in p["qas"]
    ]


def hotpotqa_rows(data: list) -> list[dict]:
    return [
        {"id": item["_id"], "question": item["question"], "answer": item["answer"], "type": item["type"],
         "level": item["level"], "supporting_facts": {"title": [], "sent_id": []},
         "context": {"title": [t for t, _ in item["context"]], "sentences": [s for _, s in item["context"]]}}
        for item in data
    ]


def test_qa_corpora_from_hub_rows_equal_the_official_files(data_dir, tmp_path, tok, monkeypatch):
    squad = json.loads(Path(data_dir, "ruler", "squad.json").read_text())
    hotpot = json.loads(Path(data_dir, "ruler", "hotpotqa.json").read_text())
    assert ruler_data.read_squad(ruler_data.squad_from_rows(squad_rows(squad))) == ruler_data.read_squad(squad)
    assert ruler_data.read_hotpotqa(ruler_data.hotpotqa_from_rows(hotpotqa_rows(hotpot))) == (
        ruler_data.read_hotpotqa(hotpot))
    rows = {"rajpurkar/squad_v2": squad_rows(squad), "hotpotqa/hotpot_qa": hotpotqa_rows(hotpot)}
    calls = []

    def hub(repo, config, split):
        calls.append((repo, config, split))
        return rows[repo]

    monkeypatch.setattr(corpora, "hub_rows", hub)
    for name in ("ruler_qa_1", "ruler_qa_2"):
        local = tasks.get(name, data_dir=data_dir).samples(tok, 4096, limit=2)
        remote = tasks.get(name, data_dir=str(tmp_path)).samples(tok, 4096, limit=2)
        assert [s.input_ids for s in remote] == [s.input_ids for s in local]
    assert calls == [("rajpurkar/squad_v2", None, "validation"), ("hotpotqa/hotpot_qa", "distractor", "validation")]
