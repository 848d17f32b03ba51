"""LongBench v1 (21 datasets) and LongBench-E (13), as `THUDM/LongBench` @ 2e00731 runs them (`LongBench/pred.py`,
`LongBench/eval.py`).

Protocol per record: ``dataset2prompt[dataset].format(**record)`` (byte-exact templates, shipped in
`data/longbench/`); middle truncation of that prompt to ``length − 500`` tokens (the official ``model2maxlen`` rule:
3500 for a 4K model) before any chat wrapping; the tokenizer's chat template except for the six few-shot/code
datasets; ``dataset2maxlen`` new tokens; samsum with at least one new token and "\\n" as a stop token. Scoring: the
first-line cut for trec/triviaqa/samsum/lsht, then the best official metric over the gold answers.
"""

from __future__ import annotations

import json
import math
import string
import zipfile
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from .base import LengthTooShortError, Sample, Task, register, render
from .corpora import Source, fetch
from .longbench_metrics import FIRST_LINE_DATASETS, METRICS

DATASETS = list(METRICS)
"""The 21 LongBench v1 datasets."""

E_DATASETS = [
    "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "gov_report", "multi_news", "trec", "triviaqa", "samsum",
    "passage_count", "passage_retrieval_en", "lcc", "repobench-p",
]
"""The 13 LongBench-E datasets (English and code)."""

NO_CHAT_DATASETS = ("trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p")
"""Datasets whose prompt is not wrapped in the chat template."""

BUCKETS = ("0-4k", "4-8k", "8k+")
TRUNCATION_MARGIN = 500
MAX_MEMBER_BYTES = 512 << 20
"""The largest uncompressed file read from a zip archive (the largest of LongBench's data.zip holds tens of MB)."""


def score(dataset: str, prediction: str, answers: list[str], all_classes: list[str] | None) -> float:
    """Official LongBench score of one prediction in [0, 1]: the first-line cut (``lstrip("\\n")``, first line) for
    trec, triviaqa, samsum and lsht, then the maximum of the dataset's metric over the gold answers (0 if none).

    ``dataset`` is a v1 name (LongBench-E datasets score under their base name, e.g. ``"hotpotqa"``).
    """
    if dataset not in METRICS:
        raise ValueError(f"unknown LongBench dataset {dataset!r}; valid: {', '.join(DATASETS)}")
    if dataset in FIRST_LINE_DATASETS:
        prediction = prediction.lstrip("\n").split("\n")[0]
    best = 0.0
    for gold in answers:
        best = max(best, METRICS[dataset](prediction, gold, all_classes=all_classes))
    return best


def bucket(length: int) -> str:
    """LongBench-E bucket of a record's ``length`` field (words, or characters for Chinese; not tokens)."""
    return "0-4k" if length < 4000 else "4-8k" if length < 8000 else "8k+"


def middle_truncate(tokenizer, prompt: str, max_length: int) -> str:
    """``pred.py``'s truncation: when the prompt has more than ``max_length`` tokens (default special tokens
    included), keep ``half = int(max_length / 2)`` tokens from each end, decoded separately without special tokens
    and concatenated."""
    ids = tokenizer(prompt).input_ids
    if len(ids) <= max_length:
        return prompt
    half = int(max_length / 2)
    return tokenizer.decode(ids[:half], skip_special_tokens=True) + tokenizer.decode(
        ids[-half:], skip_special_tokens=True
    )


@lru_cache(maxsize=1)
def official_config() -> tuple[dict[str, str], dict[str, int]]:
    """LongBench's ``dataset2prompt`` (dataset → prompt template) and ``dataset2maxlen`` (dataset → new tokens)."""
    folder = resources.files(__package__) / "data" / "longbench"
    prompts = json.loads((folder / "dataset2prompt.json").read_text(encoding="utf-8"))
    budgets = json.loads((folder / "dataset2maxlen.json").read_text(encoding="utf-8"))
    return prompts, budgets


def data_source(stem: str) -> Source:
    """Where ``data/<stem>.jsonl`` of LongBench's ``data.zip`` is looked up."""
    return Source(
        f"LongBench data file data/{stem}.jsonl",
        (f"longbench/data/{stem}.jsonl", "longbench/data.zip"),
        "It is in data.zip of the THUDM/LongBench dataset repository on the Hugging Face hub (unzip it into "
        "longbench/ or place the zip there).",
        hub=("THUDM/LongBench", "data.zip"),
    )


def load_records(stem: str, data_dir) -> list[dict[str, Any]]:
    """The records of ``data/<stem>.jsonl`` (``<dataset>`` or ``<dataset>_e``), from a JSONL file or the zip."""
    source = data_source(stem)
    path = fetch(source, data_dir)
    if path.suffix == ".zip":
        text = zip_member(path, f"data/{stem}.jsonl").decode("utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path} ({stem}), line {number}: not a JSON record ({err.msg})") from None
    return records


def zip_member(path, member: str, limit: int = MAX_MEMBER_BYTES) -> bytes:
    """The bytes of ``member`` of the zip archive ``path``, refused before it is read when its size exceeds ``limit``
    (zipfile never inflates a member beyond the size the archive states, so a crafted archive cannot exhaust memory).

    Raises:
        FileNotFoundError: the archive has no such member.
        ValueError: ``path`` is not a zip archive, or the member is larger than ``limit``.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            if member not in archive.namelist():
                raise FileNotFoundError(f"{path} has no {member}: is it LongBench's data.zip?")
            size = archive.getinfo(member).file_size
            if size > limit:
                raise ValueError(f"{path}: {member} holds {size:,} bytes uncompressed, more than the {limit:,} a "
                                 "corpus file may hold; is it LongBench's data.zip?")
            return archive.read(member)
    except zipfile.BadZipFile as err:
        raise ValueError(f"{path} is not a readable zip archive ({err})") from None


def check_record(record: Any, template: str, where: str) -> None:
    """Refuse a LongBench record that is not what ``pred.py`` and ``eval.py`` read: a JSON object whose ``template``
    fields (``context``, ``input``, ...) are strings, ``answers`` a list of strings (a string would be scored as its
    letters), ``all_classes`` a list of strings or null, ``length`` a whole number of words and ``_id`` a string.

    Raises:
        ValueError: one line starting with ``where`` and naming the field.
    """
    if not isinstance(record, dict):
        raise ValueError(f"{where} is not a JSON object")
    texts = sorted({name for _, name, _, _ in string.Formatter().parse(template) if name} | {"_id"})
    for name in [*texts, "answers", "all_classes", "length"]:
        if name not in record:
            raise ValueError(f"{where} lacks a LongBench field ({name!r})")
    for name in texts:
        if not isinstance(record[name], str):
            raise ValueError(f"{where}: {name} must be a string, got {type(record[name]).__name__}")
    answers, classes, length = record["answers"], record["all_classes"], record["length"]
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise ValueError(f"{where}: answers must be a list of strings, got {answers!r:.80}")
    if classes is not None and (not isinstance(classes, list) or not all(isinstance(c, str) for c in classes)):
        raise ValueError(f"{where}: all_classes must be a list of strings or null, got {classes!r:.80}")
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"{where}: length must be a whole number of words >= 0, got {length!r:.80}")


class LongBench(Task):
    """One LongBench dataset (v1, or LongBench-E when ``extended``), read from ``data/<stem>.jsonl``."""

    dataset = ""
    extended = False
    stem = ""

    def samples(self, tokenizer, length: int, limit: int | None = None, seed: int = 42) -> list[Sample]:
        """The records in file order (the first ``limit``), truncated to ``length − 500`` prompt tokens; the seed is
        unused (the data are fixed)."""
        max_length = length - TRUNCATION_MARGIN
        if max_length < 2:
            raise LengthTooShortError(f"{self.name}: a target length of {length} tokens is too short: LongBench "
                                      f"truncates prompts to length − {TRUNCATION_MARGIN}, so it needs at least "
                                      f"{TRUNCATION_MARGIN + 2} tokens")
        prompts, budgets = official_config()
        records = load_records(self.stem, self.data_dir)
        chat = False if self.dataset in NO_CHAT_DATASETS else None
        stop, min_new = [], 0
        if self.dataset == "samsum":
            stop, min_new = [tokenizer.encode("\n", add_special_tokens=False)[-1]], 1
        result = []
        for index, record in enumerate(records[:limit]):
            check_record(record, prompts[self.dataset], f"{self.name}: record {index}")
            prompt = prompts[self.dataset].format(**record)
            metadata = {"length": record["length"], "all_classes": record["all_classes"], "_id": record["_id"]}
            answers = list(record["answers"])
            ids = render(tokenizer, middle_truncate(tokenizer, prompt, max_length), chat=chat)
            result.append(Sample(f"{index}", ids, budgets[self.dataset], answers, metadata, stop, min_new))
        return result

    def score(self, prediction: str, sample: Sample) -> float:
        # eval.py scores every line with the all_classes of the file's last line; the lists are identical within a file
        return score(self.dataset, prediction, sample.references, sample.metadata["all_classes"])

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, float]:
        """``eval.py``: ``round(100 · total / n, 2)``; LongBench-E adds per-bucket ``round(100 · np.mean, 2)``
        (NaN for an empty bucket) as ``score_0-4k``, ``score_4-8k``, ``score_8k+``."""
        total = 0.0
        for record in records:
            total += record["score"]
        metrics = {"score": round(100 * total / len(records), 2) if records else float("nan")}
        if self.extended:
            groups: dict[str, list[float]] = {b: [] for b in BUCKETS}
            for record in records:
                groups[bucket(record["metadata"]["length"])].append(record["score"])
            for name, scores in groups.items():
                metrics[f"score_{name}"] = float(round(100 * np.mean(scores), 2)) if scores else math.nan
        return metrics


def _register_all() -> None:
    for extended, names in ((False, DATASETS), (True, E_DATASETS)):
        group = "longbench_e" if extended else "longbench"
        for dataset in names:
            stem = f"{dataset}_e" if extended else dataset
            attrs = {"dataset": dataset, "extended": extended, "stem": stem, "sources": (data_source(stem),),
                     "identities": frozenset({f"dataset:{dataset}"}),  # LongBench-E: the same dataset as v1's
                     "__doc__": f"LongBench{'-E' if extended else ''} {dataset} (official prompt, truncation and "
                     "metric)."}
            register(f"{group}_{dataset}", group=group)(type(f"LongBench_{group}_{dataset}", (LongBench,), attrs))


_register_all()
