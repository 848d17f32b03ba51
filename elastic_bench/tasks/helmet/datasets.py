"""HELMET's datasets in the categories whose scorers need no model judge (princeton-nlp/HELMET @ 4526dfb, MIT,
`data.py`, `scripts/generate_configs.py`, `configs/*.yaml`): synthetic recall, RAG, passage re-ranking, many-shot
in-context learning, and long-document multiple choice. Item selection, demonstrations, templates, generation
budgets and metrics follow the loaders of `data.py` line by line; the lists below are upstream's.
"""

from __future__ import annotations

import hashlib
import math
import random
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..base import Sample
from ..corpora import Source, fetch
from ..ranking import ndcg
from ..records import fields, load, read_records
from .metrics import best_of_parsed, exact_match, parse_output, parse_rankings, substring_exact_match
from .protocol import LENGTHS, Helmet, data_source, shuffled

SEED = 42


def _sha_seed(text: str) -> int:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest(), 16) % 2**31


def _first_by_key(records: list[dict[str, Any]], order: list[int], key: str, count: int) -> list[dict[str, Any]]:
    """``drop_duplicates(shuffled, key).select(range(count))``: the first ``count`` records of ``order`` with
    distinct ``key``."""
    seen, picked = set(), []
    for i in order:
        if records[i][key] not in seen and len(picked) < count:
            seen.add(records[i][key])
            picked.append(records[i])
    if len(picked) < count:
        raise ValueError(f"HELMET: only {len(picked)} demonstrations with distinct {key!r}, {count} needed")
    return picked


class FileTask(Helmet):
    """A HELMET dataset read from data.tar.gz: ``test_files`` per HELMET length, an optional ``demo_file``."""

    test_files: tuple[str, ...] = ()
    demo_file = ""
    samples_per_length = 100

    @classmethod
    def file_sources(cls) -> tuple[Source, ...]:
        return tuple(data_source(f) for f in (*cls.test_files, *([cls.demo_file] if cls.demo_file else ())))

    def read(self, path: str) -> list[dict[str, Any]]:
        return read_records(fetch(data_source(path), self.data_dir))


# ---- synthetic recall ---------------------------------------------------------------------------------------------


class JsonKV(FileTask):
    """JSON KV retrieval (``load_json_kv``): 100 items of the shuffled file, two demonstrations, substring EM."""

    user_template = ("{context}\n\nExtract the value corresponding to the specified key in the JSON object below.\n\n"
                     "{demos}Key: {question}")
    system_template = "Corresponding value:"
    generation = 100
    test_files = tuple(f"data/json_kv/test_k{k}_dep6.jsonl" for k in (50, 105, 220, 440, 900, 1800))
    shots = 2

    def items(self, index):
        records = self.read(self.test_files[index])
        items = []
        for i in shuffled(len(records), SEED)[: self.samples_per_length]:
            context, question, answer, demos = fields(records[i], ("context", "question", "answer", "demos"),
                                                      self.name, i)
            demo_text = "\n\n".join(f"Key: {k}\nCorresponding value: {v}" for k, v in demos[: self.shots]) + "\n\n"
            items.append({"context": context, "question": question, "demos": demo_text, "answer": answer})
        return items

    def metric(self, output, sample):
        return best_of_parsed(substring_exact_match, output, sample.references, "corresponding value:")


class RulerNiah(FileTask):
    """HELMET's RULER needle files (``load_ruler``): 100 items of the shuffled file, recall of the values."""

    folder = ""

    def items(self, index):
        records = self.read(self.test_files[index])
        items = []
        for i in shuffled(len(records), SEED)[: self.samples_per_length]:
            record = records[i]
            answer = record["answer"] if "answer" in record else record.get("outputs")
            if "context" not in record or not isinstance(answer, list):
                raise ValueError(f"{self.name}: record {i} lacks context or its answer list")
            items.append({**record, "answer": answer})
        return items

    def metric(self, output, sample):
        return sum(a.lower() in output.lower() for a in sample.references) / len(sample.references)


def niah_attributes(folder: str, generation: int, many: bool) -> dict[str, Any]:
    if many:
        user = ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
                "I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic "
                "{type_needle_v} for {query} mentioned in the provided text?")
        system = "The special magic {type_needle_v} for {query} mentioned in the provided text are"
    else:
        user = ("A special magic {type_needle_v} is hidden within the following text. Make sure to memorize it. I "
                "will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat is the special magic "
                "{type_needle_v} for {query} mentioned in the provided text?")
        system = "The special magic {type_needle_v} for {query} mentioned in the provided text is"
    return {"folder": folder, "generation": generation, "user_template": user, "system_template": system,
            "test_files": tuple(f"data/ruler/{folder}/validation_{n}.jsonl" for n in LENGTHS)}


# ---- retrieval-augmented generation -------------------------------------------------------------------------------


class Kilt(FileTask):
    """KILT questions over retrieved passages (``load_qa``): 100 questions drawn with ``random.seed(42)``, two
    demonstrations per question shuffled by its hash, substring EM."""

    user_template = ("Use the given documents to write a concise and short answer to the question. Write your answer "
                     "in the following format:\nAnswer: [answer]\n\n{demos}{context}\n\nQuestion: {question}")
    system_template = "Answer:"
    generation = 20
    shots = 2
    popularity_threshold: float | None = None

    def items(self, index):
        data, demos = self.read(self.test_files[index]), self.read(self.demo_file)
        if self.popularity_threshold is not None:
            data = [d for d in data if math.log10(d["s_pop"]) < self.popularity_threshold]
            demos = [d for d in demos if math.log10(d["s_pop"]) < self.popularity_threshold]
        key = "id" if data and "id" in data[0] else "question"
        keys = sorted({d[key] for d in data})
        chosen = set(random.Random(SEED).sample(keys, min(self.samples_per_length, len(keys))))
        items = []
        for sample in (d for d in data if d[key] in chosen):
            pool = [d for d in demos if d[key] != sample[key]] if self.popularity_threshold is not None else demos
            picked = _first_by_key(pool, shuffled(len(pool), _sha_seed(str(sample[key]))), key, self.shots)
            demo_text = "\n\n".join(
                "{documents}\n\nQuestion: {question}\nAnswer: {answer}".format(
                    **d, documents=_passages(d["ctxs"]), answer=d["answers"][0]) for d in picked) + "\n\n"
            items.append({"demos": demo_text, "context": _passages(sample["ctxs"]), "question": sample["question"],
                          "answer": list(sample["answers"])})
        return items

    def metric(self, output, sample):
        return best_of_parsed(substring_exact_match, output, sample.references)


def _passages(ctxs: list[dict[str, Any]]) -> str:
    return "\n\n".join("Document (Title: {title}): {text}".format(**c) for c in ctxs)


def kilt_attributes(name: str, depth: int, ks: tuple[int, ...], threshold: float | None = None) -> dict[str, Any]:
    stem = "popqa_test_1000" if name == "popqa" else f"{name}-dev-multikilt_1000"
    demo = "popqa_test_1000" if name == "popqa" else f"{name}-train-multikilt_1000"
    return {"test_files": tuple(f"data/kilt/{stem}_k{k}_dep{depth}.jsonl" for k in ks),
            "demo_file": f"data/kilt/{demo}_k3_dep{depth}.jsonl", "popularity_threshold": threshold}


# ---- passage re-ranking -------------------------------------------------------------------------------------------


class MsMarco(FileTask):
    """MS MARCO passage re-ranking (``load_msmarco_rerank``): 100 queries drawn with ``random.seed(42)``, two
    demonstrations, NDCG@10 of the parsed ranking."""

    user_template = ("You are provided with a list of documents, each indicated by their ID. Rank each document based "
                     "on their relevance to the question in descending order from most relelvant to least relevant "
                     "texts. Include all documents in the rankings. Write your answer using the unique IDs, with the "
                     "following format:\nRanking: ID3 > ID1 > ID2\n\n{demos}{context}\n\nQuery: {question}")
    system_template = "Ranking:"
    generation = 200
    shots = 2
    test_files = tuple(f"data/msmarco/test_reranking_data_k{k}_dep3.jsonl" for k in (14, 50, 130, 285, 600, 1000))
    demo_file = "data/msmarco/test_reranking_data_k10_dep3.jsonl"

    def items(self, index):
        data, demos = self.read(self.test_files[index]), self.read(self.demo_file)
        key = "qid" if data and "qid" in data[0] else "query"
        keys = sorted({d[key] for d in data})
        chosen = set(random.Random(SEED).sample(keys, min(self.samples_per_length, len(keys))))
        data = [d for d in data if d[key] in chosen]
        filtered = len(demos) > 2 * len(data)
        if filtered:
            qids = {d["qid"] for d in data}
            demos = [d for d in demos if d["qid"] not in qids]
        items = []
        for sample in data:
            template = ("[ID: {id}] Document (Title: {title}): {text}" if "title" in sample["ctxs"][0]
                        else "[ID: {id}] Document: {text}")
            pool = demos if filtered else [d for d in demos if d["qid"] != sample["qid"]]
            picked = _first_by_key(pool, shuffled(len(pool), abs(_sha_seed(sample["qid"]))), "qid", self.shots)
            demo_text = "".join("\n\n".join(template.format(**c) for c in d["ctxs"])
                                + f"\n\nQuery: {d['query']}\nRanking: {_gold_ranking(d['ctxs'])}\n\n" for d in picked)
            items.append({"context": "\n\n".join(template.format(**c) for c in sample["ctxs"]),
                          "question": sample["query"], "demos": demo_text, "answer": _gold_ranking(sample["ctxs"]),
                          "qid": sample["qid"], "qrel": {c["id"]: int(c["label"]) for c in sample["ctxs"]}})
        return items

    def metric(self, output, sample):
        return round(ndcg(parse_rankings(output), sample.metadata["qrel"], 10), 5)


def _gold_ranking(ctxs: list[dict[str, Any]]) -> str:
    return " > ".join(c["id"] for c in sorted(ctxs, key=lambda c: c["label"], reverse=True))


# ---- many-shot in-context learning --------------------------------------------------------------------------------


def balance_labels(data: list[dict[str, Any]], label: str, shots: int, seed: int) -> list[dict[str, Any]]:
    """``balance_labels``: ``shots`` records in rounds holding one record of every label (labels in order of first
    appearance, each round shuffled), drawn with ``random.Random(seed)``."""
    rand = random.Random(seed)
    groups: dict[Any, list[dict[str, Any]]] = {}
    for record in data:
        groups.setdefault(record[label], []).append(record)
    rounds = math.ceil(shots / len(groups))
    table: list[list[dict[str, Any]]] = [[] for _ in range(rounds)]
    for members in groups.values():
        indices = rand.sample(range(len(members)), rounds % len(members))
        while len(indices) < rounds:
            indices += rand.sample(range(len(members)), min(rounds - len(indices), len(members)))
        for i, index in enumerate(indices):
            table[i].append(members[index])
    for row in table:
        rand.shuffle(row)
    return [record for row in table for record in row][:shots]


class Icl(Helmet):
    """Many-shot classification with labels mapped to shuffled integers (``load_icl``, the ``_balance`` variants):
    500 test texts balanced over labels, demonstrations balanced per text, exact match of the parsed label."""

    user_template = ('Use the provided mapping from the text to label to assign a label to the text. Only output '
                     '"label: {{label}}" and nothing else. \n\n{context}\n\n{question}')
    system_template = "label:"
    generation = 20
    category = "robust"  # in-context learning: the Elastic paper's sparsity-robust family
    shots: tuple[int, ...] = ()
    label = ""
    labels = 0
    splits: dict[str, Source] = {}
    samples_per_length = 500

    def train_test(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return load(self.splits["train"], self.data_dir), load(self.splits["test"], self.data_dir)

    def items(self, index):
        train, test = self.train_test()
        if len(test) > self.samples_per_length:
            test = balance_labels([test[i] for i in shuffled(len(test), SEED)], self.label, self.samples_per_length,
                                  SEED)
        items = []
        for sample in test:
            local_seed = (int(hashlib.sha256(sample["text"].encode("utf-8")).hexdigest(), 16) + SEED) % 2**31
            demos = balance_labels(train, self.label, self.shots[index], local_seed)
            mapping = list(range(self.labels))
            random.Random(local_seed).shuffle(mapping)
            context = "\n\n".join(f"{d['text']}\nlabel: {mapping[int(d[self.label])]}" for d in demos)
            items.append({"context": context, "question": sample["text"],
                          "answer": str(mapping[int(sample[self.label])])})
        return items

    def metric(self, output, sample):
        return exact_match(parse_output(output, "label:"), sample.references)


class IclHeldOut(Icl):
    """NLU: one hub split, divided as ``train_test_split(test_size=0.1, seed=42)`` (the test rows are the first
    ``ceil(0.1·n)`` of ``default_rng(42)``'s permutation, the training rows the rest)."""

    def train_test(self):
        rows = load(self.splits["train"], self.data_dir)
        order, held_out = shuffled(len(rows), SEED), math.ceil(0.1 * len(rows))
        return [rows[i] for i in order[held_out:]], [rows[i] for i in order[:held_out]]


def icl_source(name: str, split: str, repo: str, config: str | None) -> Source:
    return Source(f"HELMET ICL {name} {split} rows", (f"helmet/icl/{name}/{split}.jsonl",),
                  f"They are the {split} rows of the {repo} dataset on the Hugging Face hub (one JSON object per "
                  "line).", hub_rows=(repo, config, split))


# ---- long-document multiple choice --------------------------------------------------------------------------------

INFBENCH = "xinrongzhang2022/InfiniteBench"


class InfBenchChoice(Helmet):
    """∞Bench En.MC (``load_infbench``, ``infbench_choice_eng``): 100 of the shuffled books with two demonstrations
    (their stories elided), through the chat template; exact match of the letter, or the ``A. option`` text
    anywhere in the output. HELMET first cuts each book to 130,862 Llama-2 tokens (plus a note that the rest is
    omitted); that is not done here, which leaves the input unchanged wherever the run's length truncates the book
    further (every HELMET length below 128K)."""

    user_template = ("You are given a story and a question with multiple choices. Choose the best answer from the "
                     "options provided. Only one of the following options is correct, output the answer using one "
                     "single letter (A, B, C, or D). Don't say anything else.\n\n{demo}{context}\n\nQuestion: "
                     "{question}\nOptions:\n{options}")
    system_template = "Answer:"
    generation = 10
    chat = True
    shots = 2
    sources = (Source("∞Bench longbook_choice_eng.jsonl", ("helmet/infbench/longbook_choice_eng.jsonl",),
                      f"It is longbook_choice_eng.jsonl of the {INFBENCH} dataset on the Hugging Face hub.",
                      hub=(INFBENCH, "longbook_choice_eng.jsonl")),)

    def items(self, index):
        books = _choice_books(str(fetch(self.sources[0], self.data_dir)))
        items = []
        for i in shuffled(len(books), SEED)[:100]:
            book = books[i]
            others = [b for b in books if b["id"] != book["id"]]
            demos = [others[j] for j in shuffled(len(others), SEED)[: self.shots]]
            demo = "\n\n".join(f"[story text]\nQuestion: {d['question']}\nOptions:\n{d['options']}\nAnswer: "
                               f"{d['answer'][0]}" for d in demos)
            items.append({**book, "demo": f"For example:\n\n{demo}\n\nNow, read the following story:\n\n"})
        return items

    def metric(self, output: str, sample: Sample) -> float:
        """``choice_post_process``: exact match of the output or its parsed form against the letter and the
        ``A. option`` text, else 1 when the ``A. option`` text occurs in the lower-cased output."""
        letter_and_text = sample.references
        best = max(exact_match(output, letter_and_text), exact_match(parse_output(output), letter_and_text))
        return 1.0 if letter_and_text[1].lower() in output.lower() else best


@lru_cache(maxsize=1)
def _choice_books(path: str) -> list[dict[str, Any]]:
    books = []
    for record in read_records(Path(path)):
        options = list(record["options"])
        letter = chr(ord("A") + options.index(record["answer"][0]))
        books.append({"id": record["id"], "context": record["context"], "question": record["input"],
                      "options": "A. {}\nB. {}\nC. {}\nD. {}".format(*options),
                      "answer": [letter, f"{letter}. {record['answer'][0]}"]})
    return books
