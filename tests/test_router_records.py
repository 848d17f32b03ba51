"""Router training records made by the project (`elastic_bench.training.make_records`, ``elastic-bench records``):
both categories at the requested lengths with the tiny Llama's and the testbed's tokenizers for every task, labels
drawn from the text, one file per seed, a corpus as the text, user errors before the tokenizer loads, and
`train-router` on the default records, which no benchmark's held-out rule refuses."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from collections import Counter

import pytest
import torch
from fixtures.tasks_data import write_ruler

from elastic_bench.method.data import DEFAULT_TARGETS, load_examples
from elastic_bench.method.modes import ModeConfig
from elastic_bench.method.router_records import RecordsConfig, write_router_records
from elastic_bench.method.trainer import RouterTrainConfig, train
from elastic_bench.modeling.loading import load_model
from elastic_bench.training.engine import RunOptions, tokenize
from elastic_bench.training.labelled_tasks import ICL_RECENT, stdlib_lines
from elastic_bench.training.make_records import CATEGORIES, DEFAULT_TASKS, default_lengths, task_names
from elastic_bench.training.records import PAPER_LABELS, read_records

LENGTHS = [1024, 2048]
SENSITIVE = [name for name, category in task_names().items() if category == "sensitive"]


@pytest.fixture(scope="module")
def records_of(tmp_path_factory):
    """``records_of(model)``: the path of the records of every task written for ``model`` at `LENGTHS`, as many per
    category and length as there are sensitive tasks (each once), written once per module."""
    written = {}

    def write(model: str):
        if model not in written:
            path = tmp_path_factory.mktemp("records") / "records.jsonl"
            config = RecordsConfig(model=model, output=str(path), lengths=LENGTHS, samples=len(SENSITIVE),
                                   tasks=list(task_names()), progress=False)
            assert write_router_records(config) == len(LENGTHS) * len(CATEGORIES) * len(SENSITIVE)
            written[model] = path
        return written[model]

    return write


def _context(prompt: str) -> str:
    """The text between a text task's instruction and its question."""
    return prompt[prompt.index("\n\n") + 2 : prompt.rindex("\n\n")]


@pytest.mark.parametrize("model", ["tiny:llama", "testbed"])
def test_both_categories_at_the_requested_lengths(model, records_of):
    path = records_of(model)
    records = read_records(path)
    examples = load_examples(path, DEFAULT_TARGETS)  # what train-router reads: every category has a target
    _, tokenizer = load_model(model, device="cpu")  # the tokenizer load_model pairs with the model
    measured = tokenize(examples, tokenizer, list(CATEGORIES), max_tokens=1 << 30)
    for record, sample in zip(records, measured, strict=True):
        assert 0.9 * record["length"] <= len(sample.input_ids) == record["tokens"] <= record["length"], record["task"]
    assert Counter((r["category"], r["length"]) for r in records) == {
        (category, length): len(SENSITIVE) for category in CATEGORIES for length in LENGTHS}
    assert {r["task"] for r in records} == set(task_names())
    assert all(task_names()[r["task"]] == r["category"] for r in records)
    assert all(r["identities"] and r["label"] in (None, *PAPER_LABELS) for r in records)


def test_labels_come_from_the_text(records_of):
    """Needle answers and facts are in the prompt; a repeat copies the context's end; a summary is the last
    paragraph's lead; code continues the standard library's lines; an example near the end carries the asked tag."""
    checked = Counter()
    code = "\n".join(stdlib_lines())
    for record in read_records(records_of("tiny:llama")):
        task, prompt, answer = record["task"], record["prompt"], record["answer"]
        if task == "repeat":  # the sentences, joined by a space also across a paragraph's end
            assert " ".join(_context(prompt).split()).endswith(answer)
        elif task == "summary":
            assert _context(prompt).split("\n\n")[-1].startswith(answer)
        elif task in ("passkey", "recent_needle") or task.startswith("ruler_niah"):
            values = re.split(r" (?:is|are):? ", answer)[-1].rstrip(".").split(", ")
            assert all(value in prompt for value in values), task
        elif task in ("single_qa", "multihop_qa"):  # the fact, and for a chain both of its sentences
            assert all(sentence + "." in prompt for sentence in answer.rstrip(".").split(". ")), task
        elif task == "code":
            lines = prompt.split("```python\n")[1].removesuffix("\n```").splitlines()
            assert "\n".join(lines[-3:]) in code and answer.strip() and answer in code
        elif task == "icl":
            assert f"Tag: {answer}" in "\n\n".join(prompt.split("\n\n")[-ICL_RECENT - 1:])
        else:
            continue
        checked[task] += 1
    assert set(checked) == {"repeat", "summary", "passkey", "recent_needle", "single_qa", "multihop_qa", "code", "icl",
                            *(n for n in SENSITIVE if "niah" in n)}


def test_a_seed_writes_the_same_file_and_another_seed_another(tmp_path):
    """Byte-identical across processes (another hash seed), different for another seed."""

    def config(name: str, seed: int) -> RecordsConfig:
        return RecordsConfig(model="tiny:llama", output=str(tmp_path / name), lengths=[1024], samples=4, seed=seed,
                             progress=False)

    write_router_records(config("a.jsonl", 3))
    write_router_records(config("c.jsonl", 4))
    code = ("from elastic_bench.method.router_records import RecordsConfig, write_router_records; "
            f"write_router_records(RecordsConfig(**{vars(config('b.jsonl', 3))!r}))")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONHASHSEED": "123"},
                   capture_output=True)
    first = (tmp_path / "a.jsonl").read_bytes()
    assert (tmp_path / "b.jsonl").read_bytes() == first
    assert (tmp_path / "c.jsonl").read_bytes() != first


def test_a_corpus_is_the_text(tmp_path):
    """Haystacks and passages come from the corpus (two files, wrapped around when too short)."""
    data = tmp_path / "data"
    write_ruler(data, random.Random(0))  # holds an (untrained) punkt model
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for part in range(2):
        paragraphs = [" ".join(f"Line {part}-{p}-{s} of the corpus." for s in range(5)) for p in range(6)]
        (corpus / f"{part}.txt").write_text("\n\n".join(paragraphs))
    output = tmp_path / "records.jsonl"
    tasks = ["ruler_niah_single_2", "passkey", "repeat", "summary"]
    write_router_records(RecordsConfig(model="tiny:llama", output=str(output), lengths=[1024], samples=2, tasks=tasks,
                                       corpus=str(corpus), data_dir=str(data), progress=False))
    records = read_records(output)
    assert {r["task"] for r in records} == set(tasks)
    for record in records:
        assert record["prompt"].count("of the corpus.") > 20
        if record["task"] in ("repeat", "summary"):
            assert re.fullmatch(r"(Line \d-\d-\d of the corpus\. ?)+", record["answer"])


@pytest.mark.parametrize("fields, message", [
    ({"tasks": ["ruler_niah_singel_1"]}, "unknown record task 'ruler_niah_singel_1'; did you mean ruler_niah_single_1"),
    ({"lengths": [0]}, "--lengths must be positive token counts"),
    ({"samples": 0}, "--samples must be >= 1"),
    ({"min_length": 4096, "max_length": 2048}, "--max-length must be >= 4096"),
])
def test_config_errors(tmp_path, fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RecordsConfig(output=str(tmp_path / "r.jsonl"), **fields)


def test_lengths_beyond_the_model_and_a_missing_corpus_stop_before_the_tokenizer(tmp_path, monkeypatch):
    def refuse(spec):
        raise AssertionError("the tokenizer was loaded")

    monkeypatch.setattr("elastic_bench.modeling.loading.load_tokenizer", refuse)
    with pytest.raises(ValueError, match="--lengths 8192 exceed the 4096 positions of testbed"):
        write_router_records(RecordsConfig(model="testbed", output=str(tmp_path / "r.jsonl"), lengths=[2048, 8192]))
    with pytest.raises(FileNotFoundError, match="--corpus: no file or folder"):
        write_router_records(RecordsConfig(model="testbed", output=str(tmp_path / "r.jsonl"),
                                           corpus=str(tmp_path / "missing")))
    assert not (tmp_path / "r.jsonl").exists()


def test_a_task_too_long_for_a_length_is_left_out_and_a_category_needs_one_that_fits(capsys, tmp_path):
    """vt's one-shot example alone exceeds 512 tokens: niah takes its turns; with vt alone, no sensitive task fits."""
    config = RecordsConfig(model="tiny:llama", output=str(tmp_path / "r.jsonl"), lengths=[512], samples=2,
                           tasks=["ruler_vt", "ruler_niah_single_1", "repeat"], progress=False)
    assert write_router_records(config) == 4
    assert [r["task"] for r in read_records(tmp_path / "r.jsonl")] == ["ruler_niah_single_1", "repeat"] * 2
    assert re.search(r"left out where .*: ruler_vt at 512 \(\d+ tokens\)", capsys.readouterr().out)
    with pytest.raises(ValueError, match=r"no sensitive task fits a length of 512 tokens .*: ruler_vt \d+"):
        write_router_records(RecordsConfig(model="tiny:llama", output=str(tmp_path / "r.jsonl"), lengths=[512],
                                           tasks=["ruler_vt", "repeat"], progress=False))


def test_default_lengths_spread_over_the_context():
    assert default_lengths(8192) == [1024, 2048, 4096, 8192]
    assert default_lengths(1 << 18) == [1024, 2048, 4096, 8192, 16384, 32768]
    assert default_lengths(3000) == [1024, 2048, 3000]
    assert default_lengths(512) == [512]


def test_train_router_on_the_default_records_which_no_benchmark_refuses(tmp_path):
    """The default records hold the paper's five labels; a few steps on them write a router whose provenance names
    them, and the held-out rule lets it score every registered benchmark task."""
    from elastic_bench import get_method
    from elastic_bench import tasks as registry
    from elastic_bench.evaluation.held_out import artifact_provenance, in_distribution, refuse_in_distribution
    from elastic_bench.method.checkpoint import read_provenance

    path = tmp_path / "records.jsonl"
    write_router_records(RecordsConfig(model="tiny:llama", output=str(path), lengths=[1024], samples=3,
                                       progress=False))
    records = read_records(path)
    assert {r["task"] for r in records} == set(DEFAULT_TASKS)
    assert {r["label"]: r["category"] for r in records} == PAPER_LABELS
    config = RouterTrainConfig(model="tiny:llama", data=str(path), steps=2, rows_per_step=1, pack_tokens=1024,
                               eval_samples=1, device="cpu", attention=ModeConfig(sink=4, local=32,
                                                                                   granularity="token"))
    result = train(config, RunOptions(output=str(tmp_path / "router"), progress=False),
                   loaded=load_model("tiny:llama", dtype=torch.float32, device="cpu"))
    assert len(result.log) == 2 and set(result.final_omega) == set(CATEGORIES)
    assert (tmp_path / "router" / "router.safetensors").is_file()
    provenance = read_provenance(tmp_path / "router")
    assert provenance["data"]["identities"] == sorted({i for r in records for i in r["identities"]})
    assert provenance["data"]["tasks"] == {r["task"]: r["category"] for r in records}
    assert provenance["data"]["records"] == len(records) and provenance["steps"] == 2
    assert 0 < provenance["tokens_seen"] <= 2 * 1024  # two rows of at most 1,024 tokens
    method = get_method("elastic", router=str(tmp_path / "router"))
    learned = artifact_provenance(method, "")
    benchmarks = {name: registry.REGISTRY.get(name).identities for name in registry.names()}
    refuse_in_distribution(method, learned, benchmarks)  # raises nothing
    assert all(in_distribution({"router": provenance}, ids) == [] for ids in benchmarks.values())
