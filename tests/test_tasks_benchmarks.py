"""NoLiMa, BABILong, MRCR, GraphWalks, HELMET and LongBench Pro on generated fixtures in their upstream formats:
registration, length rules, prompts and chat templates, upstream's item selection and seeds, truncation, budgets,
aggregation, and the one-line error of a missing corpus."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pyarrow.parquet as pq
import pytest
from fixtures.benchmarks_data import NEEDLE_SET, NOLIMA_TEMPLATE, build

from elastic_bench import tasks
from elastic_bench.modeling.loading import bpe_tokenizer, byte_tokenizer
from elastic_bench.tasks import babilong, chat, corpora, longbench_pro, nolima
from elastic_bench.tasks.helmet import datasets as helmet
from elastic_bench.tasks.helmet import protocol

NEW = ("nolima", "babilong_10", "mrcr", "graphwalks", "helmet", "longbench_pro")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(build(tmp_path_factory.mktemp("benchmarks")))


@pytest.fixture(scope="module")
def tok():
    return bpe_tokenizer()


@pytest.fixture(autouse=True)
def no_hub(offline_hub):
    """Every test here reads the fixtures only."""


def shortest(name: str) -> int:
    return 8192 if name == "longbench_pro" else 4096


def test_registration_and_groups():
    groups = tasks.groups()
    assert groups["babilong"] == [f"babilong_qa{i}" for i in range(1, 6)] and len(groups["babilong_10"]) == 10
    assert groups["mrcr"] == ["mrcr_2needle", "mrcr_4needle", "mrcr_8needle"]
    assert groups["graphwalks"] == ["graphwalks_bfs", "graphwalks_parents"]
    assert groups["nolima"] == ["nolima", "nolima_hard"] and groups["longbench_pro"] == ["longbench_pro"]
    assert {g: len(groups[g]) for g in groups if g.startswith("helmet_")} == {
        "helmet_recall": 4, "helmet_rag": 4, "helmet_rerank": 1, "helmet_icl": 5, "helmet_longqa": 1}
    assert len(groups["helmet"]) == 15


@pytest.mark.parametrize("name", tasks.expand(list(NEW)))
def test_every_task_builds_fitting_samples_from_the_fixture(name, data_dir, tok):
    task = tasks.get(name, data_dir=data_dir)
    length = shortest(name)
    samples = task.samples(tok, length, limit=2)
    assert samples, name
    for sample in samples:
        assert sample.metadata["category"] in ("sensitive", "robust")
        if not name.startswith("babilong"):  # BABILong runs its split as it is
            assert len(sample.input_ids) + sample.max_new_tokens <= length + nolima.MARGIN
        assert 0.0 <= task.score("nothing", sample) <= 1.0
    assert task.identities and all(":" in i for i in task.identities)
    assert task.aggregate([{"score": 1.0, "metadata": s.metadata, "prediction": "x"} for s in samples])["score"] == 100


@pytest.mark.parametrize("name, path", [
    ("babilong_qa1", "babilong/data/qa1/4k.json"), ("nolima", "nolima/needlesets/needle_set.json"),
    ("mrcr_2needle", "mrcr/2needle/2needle_0.parquet"),
    ("graphwalks_bfs", "graphwalks/graphwalks_128k_and_shorter.parquet"),
    ("helmet_json_kv", "helmet/data/json_kv/test_k50_dep6.jsonl"),
    ("helmet_icl_banking77", "helmet/icl/banking77/train.jsonl"),
    ("longbench_pro", "longbench_pro/longbench_pro.json"),
])
def test_missing_data_names_the_file(name, path, tmp_path, tok):
    with pytest.raises(FileNotFoundError) as err:
        tasks.get(name, data_dir=str(tmp_path)).samples(tok, shortest(name), limit=1)
    assert str(tmp_path / path) in str(err.value) and "\n" not in str(err.value)


# ---- BABILong -------------------------------------------------------------------------------------------------------


def test_babilong_split_of_a_length_and_prompt(data_dir, tok):
    assert [babilong.split_for(n) for n in (20, 1019, 1020, 2048, 4096, 131072, 2**20)] == [
        "0k", "0k", "1k", "2k", "4k", "128k", "1M"]
    with pytest.raises(tasks.LengthTooShortError):
        babilong.split_for(19)
    sample = tasks.get("babilong_qa1", data_dir=data_dir).samples(tok, 2048, limit=1)[0]
    record = json.loads((tasks.corpora.data_root(data_dir) / "babilong/data/qa1/2k.json").read_text())[0]
    parts = babilong.protocol()["prompts"]["qa1"]
    text = f"{parts['instruction']}\n\n{parts['examples']}\n\n{parts['post_prompt']}\n\n<context>\n" \
           f"{record['input'].strip()}\n</context>\n\nQuestion: {record['question']}"
    assert tok.decode(sample.input_ids) == f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    assert sample.max_new_tokens == 20 and sample.references == [record["target"]]
    assert sample.metadata["split"] == "2k"


# ---- NoLiMa ---------------------------------------------------------------------------------------------------------


def upstream_placement(ids: list[int], decode, needle: str, context: int, depth: float) -> str:
    """``_generate_w_needle_placement`` as upstream writes it (token by token decoding)."""
    texts = [decode([i]) for i in ids]
    valid = np.array([0] + [i for i, t in enumerate(texts) if "\n" in t])
    delta = valid / (context + 1) - depth
    delta[delta < 0] = np.inf
    at = valid[np.argmin(delta)]
    start = at - int(np.round(context * depth))
    pre = decode(ids[start: at + 1])
    pre = pre[: max(pre.rfind("\n"), 0)]
    return pre + " " + needle + "\n" + decode(ids[at + 1: start + context])


def test_nolima_tests_seeds_placement_and_prompt(data_dir, tok):
    found = nolima.tests(NEEDLE_SET, "nolima", lambda: NOLIMA_TEMPLATE)
    assert [t["name"] for t in found] == ["0401_T01_onehop", "0401_T02_onehop", "0401_T01_twohop",
                                          "0401_T02_twohop", "0502_T01_onehop"]
    assert found[0]["needle"] == "Actually, {CHAR} lives next to the Kiasma museum."
    assert found[0]["question"] == "Which character has been to Helsinki?" and found[0]["seed"] == 42 + 401
    task = tasks.get("nolima", data_dir=data_dir)
    samples = task.samples(tok, 4096, limit=27)
    assert {s.metadata["context_length"] for s in samples} == {2000}
    assert task.context_length(tok, found, 8192) == 4000 and task.context_length(tok, found, 1200) == 500
    with pytest.raises(tasks.LengthTooShortError, match="shortest haystack"):
        task.context_length(tok, found, 500)
    draws = np.random.RandomState(42 + 401)
    names = [str(draws.choice(NAMES_)) for _ in range(26)]
    assert [s.references[0] for s in samples[:26]] == names
    assert samples[26].metadata["test"] == "0401_T02_onehop" and samples[26].metadata["depth"] == 0.0
    text = tok.decode(samples[5].input_ids)
    system = "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\n"
    head, tail = NOLIMA_TEMPLATE.split("{haystack}")
    assert text.startswith(system + head) and text.endswith(
        tail.format(question=found[0]["question"]) + "<|im_end|>\n<|im_start|>assistant\n")
    assert f"Actually, {names[5]} lives next to the Kiasma museum." in text
    book_text = (corpora.data_root(data_dir) / "nolima/haystack/rand_shuffle/rand_book_1.txt").read_text()
    book = nolima.Book(tok, book_text)
    ids = tok(book_text, add_special_tokens=False).input_ids
    for depth in (0.0, 0.04, 0.36, 0.5, 0.96, 1.0):
        assert book.haystack("NEEDLE.", 500, depth) == upstream_placement(ids, tok.decode, "NEEDLE.", 500, depth)


NAMES_ = NEEDLE_SET[0]["character_set"]


def test_nolima_template_is_read_from_the_data_directory(data_dir, tok, tmp_path):
    """Upstream's template is not shipped: it is read from NoLiMa's `evaluation/run_tests.py` in the data directory
    (never run), an entry's own template wins, and a missing or unusable file is one line naming it."""
    import shutil
    from importlib import resources

    shipped = resources.files("elastic_bench.tasks") / "data"
    assert not (shipped / "nolima").is_dir() and "Adobe" not in (shipped / "NOTICE.md").read_text(encoding="utf-8")
    path = corpora.data_root(data_dir) / "nolima" / "evaluation" / "run_tests.py"
    assert nolima.task_template(path) == NOLIMA_TEMPLATE
    root = tmp_path / "data"
    shutil.copytree(corpora.data_root(data_dir) / "nolima", root / "nolima")
    (root / "nolima" / "evaluation" / "run_tests.py").unlink()
    task = tasks.get("nolima", data_dir=str(root))
    with pytest.raises(FileNotFoundError) as err:
        task.samples(tok, 4096, limit=1)
    assert str(root / "nolima" / "evaluation" / "run_tests.py") in str(err.value) and "\n" not in str(err.value)
    own = [{**entry, "task_template": "Book: {haystack} Q: {question}"} for entry in NEEDLE_SET]
    (root / "nolima" / "needlesets" / "needle_set.json").write_text(json.dumps(own))
    assert tok.decode(task.samples(tok, 4096, limit=1)[0].input_ids).count("Book: ") == 1
    for code in ("DEFAULT_TASK_TEMPLATE = 'no placeholders'\n", "DEFAULT_TASK_TEMPLATE = make()\n", "def (:\n"):
        bad = tmp_path / "run_tests.py"
        bad.write_text(code)
        with pytest.raises(ValueError, match="run_tests.py"):
            nolima.task_template(bad)


def test_nolima_aggregate_per_question_type():
    records = [{"score": s, "metadata": {"question_type": q}} for s, q in [(1, "onehop"), (0, "onehop"),
                                                                          (1, "twohop")]]
    assert tasks.get("nolima").aggregate(records) == {"score": 66.67, "score_onehop": 50.0, "score_twohop": 100.0}


# ---- MRCR and GraphWalks --------------------------------------------------------------------------------------------


def test_mrcr_bins_budget_and_conversation(data_dir, tok):
    task = tasks.get("mrcr_4needle", data_dir=data_dir)
    seen = set()
    for length in (2048, 4096, 8192):
        for sample in task.samples(tok, length):
            assert length / 2 < sample.metadata["tokens"] <= length and sample.id not in seen
            assert sample.max_new_tokens == length - len(sample.input_ids)
            seen.add(sample.id)
    sample = task.samples(tok, 4096, limit=1)[0]
    record = next(r for part in (0, 1) for r in pq.read_table(f"{data_dir}/mrcr/4needle/4needle_{part}.parquet")
                  .to_pylist() if r["answer"] == sample.references[0])
    messages = json.loads(record["prompt"])
    assert sample.input_ids == tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                                   add_special_tokens=False).input_ids
    plain = byte_tokenizer()
    plain.chat_template = None
    with pytest.raises(chat.NoChatTemplateError):
        task.samples(plain, 4096, limit=1)
    assert task.score(sample.metadata["prefix"] + "x", sample) < 1.0 == task.score(sample.references[0], sample)


def test_graphwalks_bins_types_and_files(data_dir, tok):
    for name, kind in (("graphwalks_bfs", "bfs"), ("graphwalks_parents", "parents")):
        task = tasks.get(name, data_dir=data_dir)
        samples = [s for n in (1024, 2048, 4096, 8192) for s in task.samples(tok, n)]
        assert len(samples) == 4 and {s.metadata["problem_type"] for s in samples} == {kind}
        answer = "Final Answer: [" + ", ".join(samples[0].references) + "]"
        assert task.score(answer, samples[0]) == 1.0
    with pytest.raises(FileNotFoundError, match="graphwalks_256k_to_1mil.parquet"):
        tasks.get("graphwalks_bfs", data_dir=data_dir).samples(tok, 262144 + 1)


# ---- HELMET ---------------------------------------------------------------------------------------------------------


def test_helmet_lengths_prompts_and_truncation(data_dir, tok):
    assert [protocol.length_index("t", n) for n in (4096, 8191, 8192, 200000)] == [0, 0, 1, 5]
    with pytest.raises(tasks.LengthTooShortError, match="4096"):
        tasks.get("helmet_json_kv", data_dir=data_dir).samples(tok, 4095)
    task = tasks.get("helmet_json_kv", data_dir=data_dir)
    records = [json.loads(x) for x in open(f"{data_dir}/helmet/data/json_kv/test_k50_dep6.jsonl")]
    first = records[protocol.shuffled(len(records), 42)[0]]
    sample = task.samples(tok, 4096, limit=1)[0]
    demos = "".join(f"Key: {k}\nCorresponding value: {v}\n\n" for k, v in first["demos"][:2])
    expected = (f"{first['context']}\n\nExtract the value corresponding to the specified key in the JSON object "
                f"below.\n\n{demos}Key: {first['question']}\nCorresponding value:")
    assert tok.decode(sample.input_ids, skip_special_tokens=True) == expected and sample.max_new_tokens == 100
    assert sample.input_ids[0] == tok.bos_token_id or tok.bos_token_id is None
    assert task.score(" " + first["answer"], sample) == 1.0 and sample.metadata["prefix"] == "Corresponding value:"
    cut = protocol.truncate_end(tok, first["context"], 7)
    assert tok(cut).input_ids == tok(first["context"]).input_ids[:-7]
    icl = tasks.get("helmet_icl_trec_coarse", data_dir=data_dir).samples(tok, 4096, limit=1)[0]
    assert len(icl.input_ids) == 4096 - 20  # 200 demonstrations, truncated from the end


def test_helmet_rag_rerank_icl_selection(data_dir, tok):
    rows = [json.loads(x) for x in open(f"{data_dir}/helmet/data/kilt/triviaqa-dev-multikilt_1000_k20_dep6.jsonl")]
    items = tasks.get("helmet_kilt_triviaqa", data_dir=data_dir).items(0)
    assert [i["question"] for i in items] == [r["question"] for r in rows]  # 5 < 100: all, in file order
    assert items[0]["demos"].count("Question:") == 2 and items[0]["demos"].endswith("\n\n")
    pop = tasks.get("helmet_kilt_popqa", data_dir=data_dir).items(0)
    kept = [r for r in map(json.loads, open(f"{data_dir}/helmet/data/kilt/popqa_test_1000_k20_dep6.jsonl"))
            if math.log10(r["s_pop"]) < 3]
    assert [i["question"] for i in pop] == [r["question"] for r in kept]
    marco = tasks.get("helmet_msmarco_rerank", data_dir=data_dir).items(0)[0]
    assert marco["demos"].count("Ranking:") == 2 and marco["context"].startswith("[ID: ")
    labels = {k: v for k, v in marco["qrel"].items()}
    order = marco["answer"].split(" > ")
    assert [labels[i] for i in order] == sorted(labels.values(), reverse=True)
    balanced = helmet.balance_labels([{"l": i % 3, "n": i} for i in range(30)], "l", 9, 1)
    assert sorted(r["l"] for r in balanced) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert balanced == helmet.balance_labels([{"l": i % 3, "n": i} for i in range(30)], "l", 9, 1)
    test = tasks.get("helmet_icl_banking77", data_dir=data_dir).items(0)
    assert len(test) == 500  # 520 rows: shuffled, then balanced down to 500
    nlu_train, nlu_test = tasks.get("helmet_icl_nlu", data_dir=data_dir).train_test()
    assert (len(nlu_train), len(nlu_test)) == (108, 12)
    choice = tasks.get("helmet_infbench_choice", data_dir=data_dir).samples(tok, 4096, limit=1)[0]
    text = tok.decode(choice.input_ids)
    assert text.startswith("<|im_start|>user\nYou are given a story and a question with multiple choices.")
    assert "For example:\n\n[story text]\nQuestion:" in text and choice.references[1].startswith(choice.references[0])


# ---- LongBench Pro --------------------------------------------------------------------------------------------------


def test_longbench_pro_labels_truncation_and_breakdowns(data_dir, tok):
    task = tasks.get("longbench_pro", data_dir=data_dir)
    samples = task.samples(tok, 8192)
    assert len(samples) == 4 and all(s.metadata["secondary_task"] in longbench_pro.METRIC_OF_TASK for s in samples)
    assert {s.metadata["category"] for s in samples} == {"sensitive", "robust"}
    assert [s.id for s in task.samples(tok, 16384)] == ["s5", "s6", "s7", "s8"]
    assert longbench_pro.label_for(262144 * 4) == "256k"
    short = task.samples(tok, 8192 + 1024 + 200, limit=1)  # still the 8k label
    assert short[0].id == "s0"
    records = [{"score": s, "metadata": {"language": lang, "contextual_requirement": "Full", "difficulty": "Hard"}}
               for s, lang in ((1.0, "English"), (0.0, "Chinese"), (0.5, "English"))]
    metrics = task.aggregate(records)
    assert metrics["score"] == 50.0 and metrics["score_english"] == 75.0 and metrics["score_chinese"] == 0.0
    assert math.isnan(metrics["score_easy"]) and metrics["score_hard"] == 50.0


def test_random_is_not_touched_by_sample_building(data_dir, tok):
    """Upstream seeds its own generators; building samples leaves the global ones as they were."""
    random.seed(3)
    np.random.seed(3)
    tasks.get("helmet_icl_clinic150", data_dir=data_dir).samples(tok, 4096, limit=1)
    tasks.get("nolima", data_dir=data_dir).samples(tok, 4096, limit=2)
    assert random.random() == random.Random(3).random()
    assert np.random.random() == np.random.RandomState(3).random()


# ---- the catalog and `elastic-bench tasks` --------------------------------------------------------------------------


def test_every_registered_task_has_a_benchmark_with_source_and_licence():
    from elastic_bench.tasks import catalog

    for name in tasks.names():
        bench = catalog.benchmark_of(name)
        assert bench is not None and bench.upstream and bench.licence, name
    assert catalog.benchmark_of("longbench_pro").name == "LongBench Pro"
    assert catalog.benchmark_of("longbench_v2_cot").name == "LongBench-v2"
    assert all(b.note for b in catalog.BENCHMARKS if b.prefix is None)


def test_tasks_listing_shows_benchmarks_licences_and_what_is_not_registered(capsys):
    import re

    from elastic_bench.cli import main

    assert main(["tasks"]) == 0
    listing = capsys.readouterr().out
    for row in (r"NoLiMa\s+2\s+amodaresi/NoLiMa", r"BABILong\s+10\s", r"MRCR\s+3\s+openai/mrcr", r"HELMET\s+15\s",
                r"GraphWalks\s+2\s", r"LongBench Pro\s+1\s", r"mrcr\s+3$", r"helmet_icl\s+5$", r"babilong\s+5$",
                r"RULER v2\s+12\s+NVIDIA-NeMo/Skills", r"ruler2\s+12$", r"ruler2_qa_hard\s+corpus or hub\s"):
        assert re.search(rf"^{row}", listing, re.MULTILINE), row
    assert "Adobe Research License" in listing and "Not registered: RULER v2" not in listing
    # NoLiMa's template has no hub copy: the task needs a local file
    assert re.search(r"^nolima\s+corpus\s+nolima/needlesets/needle_set.json", listing, re.MULTILINE)
    assert "nolima/evaluation/run_tests.py" in listing


@pytest.mark.parametrize("path, sha256", [
    ("babilong/prompts.json", "c30f2a9daf2c1b69aa6e1599566f067b49a568b4bcb3ba6f88f0fa55a190068c"),
])
def test_shipped_upstream_strings_are_those_recorded_in_the_notice(path, sha256):
    import hashlib
    from importlib import resources

    data = (resources.files("elastic_bench.tasks") / "data" / path).read_bytes()
    assert hashlib.sha256(data).hexdigest() == sha256
    notice = (resources.files("elastic_bench.tasks") / "data" / "NOTICE.md").read_text(encoding="utf-8")
    assert sha256 in notice
