"""BABILong (booydar/babilong @ 7a6efee, Apache-2.0): bAbI facts hidden in PG-19 text, qa1–qa10, read from the
`RMT-team/babilong` release (100 samples per task and length).

Protocol (`scripts/run_model_on_babilong.py` with instruction, examples and post-prompt on, as the leaderboard runs
it): ``DEFAULT_TEMPLATE`` filled with the task's ``DEFAULT_PROMPTS`` entry, the stripped context and the question,
then stripped (`data/babilong/prompts.json`, the upstream strings); one user turn through the tokenizer's chat
template (no system prompt, as the local-model path); greedy, 20 new tokens; no truncation. Scoring is
``compare_answers`` of `babilong/metrics.py` on the stripped output: the first sentence, lower-cased, must name the
target and no other label of the task (labels the question names do not count); qa8's comma-separated targets must
all appear, and nothing else. The task's score is the accuracy in percent.

Lengths: upstream's splits are ``0k`` … ``1M``; a split of ``N k`` holds inputs of ``N·1000 − 300`` GPT-2 tokens (300
for the prompt). A run at length L reads the longest split with ``N·1000 + 20 ≤ L`` (so 4096 reads ``4k``, 1024
reads ``1k``, anything shorter ``0k``); its samples are run as they are, as upstream runs them, and may exceed L by
the difference between the model's tokenizer and GPT-2's.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from .base import GROUPS, LengthTooShortError, Sample, Task, register, render
from .corpora import Source, fetch
from .records import fields, read_records

REPO = "RMT-team/babilong"
SPLITS = ("0k", "1k", "2k", "4k", "8k", "16k", "32k", "64k", "128k", "256k", "512k", "1M")
MAX_NEW_TOKENS = 20
TASKS = tuple(f"qa{i}" for i in range(1, 11))
"""The ten tasks of the BABILong release and paper; qa1–qa5 are the leaderboard's average (group ``babilong``)."""


def split_tokens(split: str) -> int:
    """The nominal length of a split: ``"4k"`` → 4000, ``"1M"`` → 1,000,000."""
    return int(split[:-1]) * (1000 if split.endswith("k") else 1_000_000)


def split_for(length: int) -> str:
    """The split a run at ``length`` tokens reads: the longest whose nominal length plus the 20-token answer fits."""
    fitting = [s for s in SPLITS if split_tokens(s) + MAX_NEW_TOKENS <= length]
    if not fitting:
        raise LengthTooShortError(f"BABILong: a target length of {length} tokens is too short: it needs at least "
                                  f"{MAX_NEW_TOKENS} tokens for the answer")
    return fitting[-1]


@lru_cache(maxsize=1)
def protocol() -> dict[str, Any]:
    """``{"template", "prompts": {task: {instruction, examples, post_prompt}}, "labels": {task: [label, ...]}}``."""
    return json.loads((resources.files(__package__) / "data" / "babilong" / "prompts.json").read_text("utf-8"))


def format_input(task: str, context: str, question: str) -> str:
    """The model input of one sample (``get_formatted_input``): the template filled, the context stripped, the
    whole stripped."""
    parts = protocol()["prompts"][task]
    return protocol()["template"].format(context=context.strip(), question=question, **parts).strip()


def first_sentence(output: str) -> str:
    """``preprocess_output``: lower-case, keep what precedes the first ``.``, then what precedes ``<context>`` and
    ``<example>`` (its last cut, at ``"Question"``, never matches the lower-cased text)."""
    output = output.lower().split(".")[0]
    for marker in ("<context>", "<example>", "Question"):
        output = output.split(marker)[0]
    return output


def is_correct(target: str, output: str, question: str, labels: list[str]) -> bool:
    """``compare_answers``: whether ``output`` names ``target`` and no other label outside ``question``."""
    output, target = first_sentence(output), target.lower()
    labels = {label.lower() for label in labels}
    named = {label for label in labels if label in output} - {label for label in labels if label in question.lower()}
    if "," in target and len(target) > 3:  # qa8: several items
        parts = target.split(",")
        return all(part in named for part in parts) and len(named) == len(parts)
    return target in named and len(named) == 1


def source(task: str, split: str | None = None) -> Source:
    """The samples of ``task``: the folder ``babilong/data/<task>/`` of one JSON file per split, or (``split``) one
    of its files with the hub copy `RMT-team/babilong` ``data/<task>/<split>.json``."""
    how = (f"It is the {REPO} dataset on the Hugging Face hub: `huggingface-cli download {REPO} --repo-type dataset "
           "--local-dir <data dir>/babilong`.")
    if split is None:
        return Source(f"BABILong {task} samples (data/{task}/<split>.json, split 0k … 1M)", (f"babilong/data/{task}",),
                      how, hub_rows=(REPO, "<split>", task))
    return Source(f"BABILong {task} {split} samples", (f"babilong/data/{task}/{split}.json",), how,
                  hub=(REPO, f"data/{task}/{split}.json"))


class Babilong(Task):
    """One BABILong task; subclasses set ``task`` (``qa1`` … ``qa10``)."""

    task = ""
    category = "sensitive"  # the facts lie anywhere in the noise: a streaming window loses them
    identities = frozenset({"dataset:babilong"})

    def samples(self, tokenizer, length: int, limit: int | None = None, seed: int = 42) -> list[Sample]:
        """The split's samples in file order (the first ``limit``); the seed is unused (the data are fixed)."""
        split = split_for(length)
        records = read_records(fetch(source(self.task, split), self.data_dir))
        result = []
        for index, record in enumerate(records[:limit]):
            context, question, target = fields(record, ("input", "question", "target"), self.name, index)
            ids = render(tokenizer, format_input(self.task, context, question))
            metadata = {"split": split, "question": question, "category": self.category}
            result.append(Sample(f"{index}", ids, MAX_NEW_TOKENS, [target], metadata))
        return result

    def score(self, prediction: str, sample: Sample) -> float:
        labels = protocol()["labels"][self.task]
        return float(is_correct(sample.references[0], prediction.strip(), sample.metadata["question"], labels))


def _register_all() -> None:
    for task in TASKS:
        attrs = {"task": task, "sources": (source(task),),
                 "__doc__": f"BABILong {task} (official prompt and answer check; the split of the run's length)."}
        cls = register(f"babilong_{task}", group="babilong_10")(type(f"Babilong_{task}", (Babilong,), attrs))
        if task in TASKS[:5]:
            GROUPS.setdefault("babilong", []).append(cls.name)


_register_all()
