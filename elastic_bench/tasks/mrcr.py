"""OpenAI MRCR (the `openai/mrcr` dataset card, MIT; files of 2025-12 with its corrected records): a long multi-turn
conversation hiding 2, 4 or 8 identical requests; the last turn asks for the i-th answer, prefixed by a random string.

Protocol: the record's ``prompt`` (a JSON list of messages) through the tokenizer's chat template with the
assistant's generation prompt, as the card sends it to the chat API (a tokenizer without a chat template cannot lay
the turns out: the cell fails saying so); greedy; the answer may take the rest of the run's length (the card sets
no limit). Grading (the card's ``grade``): 0 unless the response starts with ``random_string_to_prepend``; else
difflib's ``SequenceMatcher(None, response, answer).ratio()`` with that prefix removed from both. The task's score
is the mean ratio in percent.

Lengths: the card bins records by the tokens of prompt plus answer, ``[4096, 8192]``, ``(8192, 16384]``, …
``(524288, 1048576]``, counted with o200k_base; here they are counted with the model's tokenizer (its rendered
prompt plus the answer's tokens), as lm-evaluation-harness does, and a run at length L holds the bin ``(L/2, L]``
(`lengths`), 100 records per needle count and bin.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from .base import Sample, Task, register
from .chat import render_messages
from .corpora import Source, fetch
from .lengths import in_bin, may_fit
from .records import fields, read_records, select

REPO = "openai/mrcr"
NEEDLES = (2, 4, 8)


def grade(response: str, answer: str, prefix: str) -> float:
    """The card's score of one response in [0, 1] (see the module docstring)."""
    if not response.startswith(prefix):
        return 0.0
    return difflib.SequenceMatcher(None, response.removeprefix(prefix), answer.removeprefix(prefix)).ratio()


def files(needles: int) -> tuple[str, ...]:
    """The record files of a needle count, in the hub dataset's layout."""
    return tuple(f"{needles}needle/{needles}needle_{part}.parquet" for part in (0, 1))


def source(filename: str) -> Source:
    return Source(f"MRCR records {filename}", (f"mrcr/{filename}",),
                  f"It is {filename} of the {REPO} dataset on the Hugging Face hub.", hub=(REPO, filename))


class Mrcr(Task):
    """MRCR records of one needle count in the run's length bin."""

    needles = 0
    category = "sensitive"  # the requested answer is one of several identical asks spread over the conversation
    identities = frozenset({"dataset:mrcr"})

    def samples(self, tokenizer, length: int, limit: int | None = None, seed: int = 42) -> list[Sample]:
        """The needle count's records in the bin, in file order (the first ``limit``); the seed is unused."""
        records = ((f"{part}-{index}", record) for part, filename in enumerate(files(self.needles))
                   for index, record in enumerate(read_records(fetch(source(filename), self.data_dir))))
        return select(records, lambda record, sample_id: self._sample(tokenizer, length, record, sample_id), limit)

    def _sample(self, tokenizer, length: int, record: dict[str, Any], sample_id: str) -> Sample | None:
        prompt, answer, prefix = fields(record, ("prompt", "answer", "random_string_to_prepend"), self.name, sample_id)
        if not may_fit(len(prompt) + len(answer), length):
            return None
        try:
            messages = json.loads(prompt)
        except json.JSONDecodeError as err:
            raise ValueError(f"{self.name}: record {sample_id}'s prompt is not a JSON message list ({err})") from None
        ids = render_messages(tokenizer, messages)
        tokens = len(ids) + len(tokenizer(answer, add_special_tokens=False).input_ids)
        if not in_bin(tokens, length):
            return None
        metadata = {"prefix": prefix, "needles": self.needles, "tokens": tokens, "category": self.category,
                    **{k: record[k] for k in ("desired_msg_index", "total_messages", "n_chars") if k in record}}
        return Sample(sample_id, ids, length - len(ids), [answer], metadata)

    def score(self, prediction: str, sample: Sample) -> float:
        return grade(prediction, sample.references[0], sample.metadata["prefix"])


for _n in NEEDLES:
    register(f"mrcr_{_n}needle", group="mrcr")(
        type(f"Mrcr_{_n}needle", (Mrcr,), {"needles": _n, "sources": tuple(source(f) for f in files(_n)),
                                          "__doc__": f"MRCR with {_n} needles (the card's prompt and grade) in the "
                                          "run's length bin."})
    )
