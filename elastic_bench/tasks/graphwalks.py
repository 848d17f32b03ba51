"""GraphWalks (the `openai/graphwalks` dataset card, MIT): a directed graph as an edge list, then a breadth-first search
or a parents query; the answer is a set of nodes.

Protocol: the record's ``prompt`` (three examples, the graph and the operation) as one user turn through the
tokenizer's chat template; greedy. The card's grader takes the response's last line, which must hold
``Final Answer:``, finds ``Final Answer: ?\\[.*\\]`` in it and splits the bracket's contents on commas (items
stripped, empty ones dropped); the score is the F1 of that node set against the answer's. Two lines of the card's
code are corrected, so that a wrong answer cannot score: its ``group(0).strip("[]")`` keeps the ``Final Answer: [``
prefix on the first node (here the prefix is removed; trailing ``]`` are still all stripped), and its
``... if recall + precision > 0 else 1`` gives 1 to an answer that shares no node with the truth, an empty or
missing list included (here 0, as lm-evaluation-harness scores it).

Lengths: upstream publishes two files (prompts up to 128K tokens, and 256K to 1M); a run at length L holds the
records whose prompt plus the answer budget falls in ``(L/2, L]`` with the model's tokenizer (`lengths`).
Upstream sets no answer budget; `MAX_NEW_TOKENS` leaves room for a node list of a few hundred nodes.
"""

from __future__ import annotations

import re
from typing import Any

from .base import Sample, Task, register, render
from .corpora import Source, fetch
from .lengths import in_bin, may_fit
from .records import fields, read_records, select

REPO = "openai/graphwalks"
SHORT, LONG = "graphwalks_128k_and_shorter.parquet", "graphwalks_256k_to_1mil.parquet"
SHORT_TOKENS = 131072
MAX_NEW_TOKENS = 1024


def final_answer(response: str) -> list[str] | None:
    """The node list of the response's last line (see the module docstring), or None when it is not there."""
    line = response.split("\n")[-1]
    if "Final Answer:" not in line:
        return None
    match = re.search(r"Final Answer: ?\[.*\]", line)
    if match is None:
        return None
    inner = re.sub(r"^Final Answer: ?\[", "", match.group(0).strip("[]"))
    return [item.strip() for item in inner.split(",") if item.strip()]


def f1(predicted: set[str], truth: set[str]) -> float:
    """Set F1: harmonic mean of ``|p ∩ t| / |t|`` and ``|p ∩ t| / |p|``; 0 when they share nothing."""
    overlap = len(predicted & truth)
    recall = overlap / len(truth) if truth else 0.0
    precision = overlap / len(predicted) if predicted else 0.0
    return 2 * recall * precision / (recall + precision) if recall + precision > 0 else 0.0


def score(response: str, answer_nodes: list[str]) -> float:
    """GraphWalks' score of one response in [0, 1]: F1 of its final node list (0 without one)."""
    nodes = final_answer(response)
    return 0.0 if nodes is None else f1(set(nodes), set(answer_nodes))


def source(filename: str) -> Source:
    return Source(f"GraphWalks records {filename}", (f"graphwalks/{filename}",),
                  f"It is {filename} of the {REPO} dataset on the Hugging Face hub.", hub=(REPO, filename),
                  when="" if filename == SHORT else f"for lengths above {SHORT_TOKENS}")


class GraphWalks(Task):
    """GraphWalks records of one problem type (``bfs`` or ``parents``)."""

    problem_type = ""
    category = "sensitive"  # the edges of a walk lie anywhere in the list
    identities = frozenset({"dataset:graphwalks"})
    sources = (source(SHORT), source(LONG))

    def samples(self, tokenizer, length: int, limit: int | None = None, seed: int = 42) -> list[Sample]:
        """The records of the problem type in the length's bin, in file order (the first ``limit``); the seed is
        unused (the data are fixed)."""
        files = [name for name, read in ((SHORT, length <= 2 * SHORT_TOKENS), (LONG, length > SHORT_TOKENS)) if read]
        records = ((f"{filename.split('_')[1]}-{index}", record) for filename in files
                   for index, record in enumerate(read_records(fetch(source(filename), self.data_dir))))
        return select(records, lambda record, sample_id: self._sample(tokenizer, length, record, sample_id), limit)

    def _sample(self, tokenizer, length: int, record: dict[str, Any], sample_id: str) -> Sample | None:
        prompt, problem_type = fields(record, ("prompt", "problem_type"), self.name, sample_id)
        if str(problem_type).lower() != self.problem_type or not may_fit(len(prompt), length):
            return None
        ids = render(tokenizer, prompt)
        if not in_bin(len(ids) + MAX_NEW_TOKENS, length):
            return None
        nodes = record.get("answer_nodes", record.get("answer"))
        if not isinstance(nodes, list):
            raise ValueError(f"{self.name}: record {sample_id} has no answer_nodes list")
        metadata = {"problem_type": self.problem_type, "category": self.category}
        return Sample(sample_id, ids, MAX_NEW_TOKENS, [str(n) for n in nodes], metadata)

    def score(self, prediction: str, sample: Sample) -> float:
        return score(prediction, sample.references)


for _type in ("bfs", "parents"):
    register(f"graphwalks_{_type}", group="graphwalks")(
        type(f"GraphWalks_{_type}", (GraphWalks,), {"problem_type": _type, "__doc__": f"GraphWalks {_type} records "
                                                   "(the card's prompt and node-set F1) in the run's length bin."})
    )
