"""NoLiMa (adobe-research/NoLiMa @ 7532e4e; data `amodaresi/NoLiMa`, Adobe Research License, non-commercial
research only): needles whose question shares no word with them, placed in shuffled public-domain books.

Protocol (`evaluation/run_tests.py`, `async_evaluate.py`, `data/book_haystack.py`, the run configurations):
- tests: for every needle-set entry, every question type (``onehop``, ``twohop``) and every test, the needle and the
  question with the test's ``{1}``, ``{2}``, … arguments substituted as upstream does (the needle takes every
  argument; the question keeps only the last substitution, upstream's loop restarting from the unfilled question);
- for each of the five books (in name order; upstream takes the folder's listing order) and each test, 26 depths
  ``linspace(0, 100, 26)``; a ``{CHAR}`` needle takes a name drawn by ``numpy.random.choice`` from the entry's
  character set, the generator seeded once per test with ``42 + int(id[:4]) + book number``, one draw per depth;
- placement: the book is tokenised without special tokens; the needle goes after the first newline token at or
  beyond ``depth·(C + 1)`` tokens, in the window of C tokens starting ``round(C·depth)`` tokens before it, as
  ``pre + " " + needle + "\\n" + post`` (the newline the needle follows removed);
- prompt: the task template (the entry's own, else ``DEFAULT_TASK_TEMPLATE`` of upstream's
  `evaluation/run_tests.py`, read from the data directory: it is not shipped, its licence being non-commercial) with
  the haystack and question, after the system prompt "You are a helpful assistant", through the tokenizer's chat
  template; greedy, 192 new tokens;
- scoring: the ``contains`` metric of the run configurations: 1 if a gold answer (the drawn name, or the test's
  ``gold_answers``) occurs in the response. The score is the accuracy in percent, with ``score_onehop`` and
  ``score_twohop``.

Lengths: upstream's context lengths C are haystack tokens, 250, 500, 1K, 2K, 4K, 8K, 16K and 32K; a run at length L
uses the longest C whose prompt (template, needle, question, system prompt and chat markup) and answer budget fit in
L (4096 runs C = 2K, 8192 runs C = 4K), so scores compare with upstream's table at that C (``context_length`` in
each sample's metadata). Needle sets with distractors are not supported.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from .base import LengthTooShortError, Sample, Task, register
from .chat import render_messages
from .corpora import Source, fetch
from .records import read_records

REPO = "amodaresi/NoLiMa"
CONTEXTS = (250, 500, 1000, 2000, 4000, 8000, 16000, 32000)
DEPTHS = np.linspace(0, 100, 26)
BOOKS = tuple(f"rand_book_{i}.txt" for i in range(1, 6))
SYSTEM_PROMPT = "You are a helpful assistant"
MAX_NEW_TOKENS = 192
BASE_SEED = 42
MARGIN = 8
"""Tokens kept free beyond the estimated prompt when choosing C (joining the haystack to the template can merge a
token or two)."""


def contains(response: str, gold: list[str]) -> float:
    """The ``contains`` metric: 1.0 if any gold answer is a substring of the response."""
    return float(any(answer in response for answer in gold))


TEMPLATE = Source(
    "NoLiMa's task template", ("nolima/evaluation/run_tests.py",),
    "It is evaluation/run_tests.py of NoLiMa's code (adobe-research/NoLiMa on GitHub, Adobe Research License), whose "
    "DEFAULT_TASK_TEMPLATE is the template: copy it from a clone of that repository, whose "
    "data/download_NoLiMa_data.sh downloads the needle sets and books.")
TEMPLATE_NAME = "DEFAULT_TASK_TEMPLATE"


def task_template(path: Path) -> str:
    """The string assigned to ``DEFAULT_TASK_TEMPLATE`` in NoLiMa's `evaluation/run_tests.py` at ``path`` (read with
    `ast`, never run).

    Raises:
        ValueError: the file is not Python, or assigns no string with ``{haystack}`` and ``{question}`` to that name.
    """
    stat = path.stat()
    return _task_template(str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=2)
def _task_template(path: str, mtime_ns: int, size: int) -> str:
    try:
        module = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, SyntaxError) as err:
        raise ValueError(f"{path} is not a readable Python file ({type(err).__name__}: {err})") from None
    assigned = [node.value for node in module.body if isinstance(node, ast.Assign)
                and any(isinstance(target, ast.Name) and target.id == TEMPLATE_NAME for target in node.targets)]
    try:
        value = ast.literal_eval(assigned[-1]) if assigned else None
    except (ValueError, TypeError):  # an expression, not a literal
        value = None
    if not (isinstance(value, str) and "{haystack}" in value and "{question}" in value):
        raise ValueError(f"{path} assigns no template string with {{haystack}} and {{question}} to {TEMPLATE_NAME}")
    return value


def tests(needle_set: list[dict[str, Any]], name: str, default_template: Callable[[], str]) -> list[dict[str, Any]]:
    """The tests of a needle set in upstream's order: ``{name, question_type, needle, question, gold, characters,
    template, seed}``; ``template`` is the entry's own, else ``default_template()`` (called once, only then)."""
    default = lru_cache(maxsize=1)(default_template)
    found = []
    for entry in needle_set:
        if "distractors" in entry:
            raise ValueError(f"{name}: needle set entry {entry.get('id')} has distractors, which are not supported")
        try:
            for question_type, question in entry["questions"].items():
                for test_id, test in entry["tests"].items():
                    needle, filled = entry["needle"], question
                    for number, argument in enumerate(test["input_args"], 1):
                        placeholder = "{" + str(number) + "}"
                        if placeholder in question:
                            filled = question.replace(placeholder, argument)
                        needle = needle.replace(placeholder, argument)
                    found.append({
                        "name": f"{entry['id']}_{test_id}_{question_type}", "question_type": question_type,
                        "needle": needle, "question": filled, "gold": test.get("gold_answers", []),
                        "characters": entry.get("character_set", []),
                        "template": entry.get("task_template") or default(),
                        "seed": BASE_SEED + int(entry["id"][:4]),
                    })
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            raise ValueError(f"{name}: a needle set entry lacks a NoLiMa field ({type(err).__name__}: {err})") from None
    return found


class Book:
    """A haystack book tokenised once for a tokenizer: its ids and the token positions a needle may follow."""

    def __init__(self, tokenizer, text: str):
        self.tokenizer = tokenizer
        self.ids = tokenizer(text, add_special_tokens=False).input_ids
        breaks = {i for i in set(self.ids) if "\n" in tokenizer.decode([i])}  # per id: as decoding each token
        self.positions = np.array([0] + [k for k, i in enumerate(self.ids) if i in breaks])

    def haystack(self, needle: str, context: int, depth: float) -> str:
        """``_generate_w_needle_placement`` without shift or static depth: the C-token window with the needle at
        ``depth`` (a fraction)."""
        delta = self.positions / (context + 1) - depth
        delta[delta < 0] = np.inf
        at = int(self.positions[int(np.argmin(delta))])
        start = at - int(np.round(context * depth))
        if start < 0 or start + context > len(self.ids):
            raise ValueError(f"NoLiMa: the book has {len(self.ids)} tokens, too few for a {context}-token haystack")
        pre = self.tokenizer.decode(self.ids[start : at + 1])
        pre = pre[: max(pre.rfind("\n"), 0)]
        return pre + " " + needle + "\n" + self.tokenizer.decode(self.ids[at + 1 : start + context])


@lru_cache(maxsize=5)
def _book(tokenizer, path: str, mtime_ns: int) -> Book:
    with open(path, encoding="utf-8") as f:
        return Book(tokenizer, f.read())


def _source(filename: str, description: str) -> Source:
    return Source(description, (f"nolima/{filename}",),
                  f"It is {filename} of the {REPO} dataset on the Hugging Face hub (accept its licence there), as "
                  "NoLiMa's data/download_NoLiMa_data.sh fetches it.", hub=(REPO, filename))


class NoLiMa(Task):
    """A NoLiMa needle set; subclasses set ``needle_set``."""

    needle_set = ""
    category = "sensitive"  # the needle must be found by association, anywhere in the book
    identities = frozenset({"dataset:nolima"})

    def messages(self, template: str, haystack: str, question: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": template.format(haystack=haystack, question=question)}]

    def context_length(self, tokenizer, found: list[dict[str, Any]], length: int) -> int:
        """The longest of `CONTEXTS` whose prompts all fit ``length`` with the answer budget (estimated from the
        longest needle-and-question overhead, plus `MARGIN`)."""
        overhead = 0
        for test in found:
            needle = test["needle"].replace("{CHAR}", max(test["characters"] or [""], key=len))
            question = test["question"].replace("{CHAR}", max(test["characters"] or [""], key=len))
            prompt = len(render_messages(tokenizer, self.messages(test["template"], "", question)))
            overhead = max(overhead, prompt + len(tokenizer(" " + needle + "\n", add_special_tokens=False).input_ids))
        fitting = [c for c in CONTEXTS if c + overhead + MARGIN + MAX_NEW_TOKENS <= length]
        if not fitting:
            raise LengthTooShortError(f"{self.name}: a target length of {length} tokens is too short: its shortest "
                                      f"haystack ({CONTEXTS[0]} tokens) needs "
                                      f"{CONTEXTS[0] + overhead + MARGIN + MAX_NEW_TOKENS} with the prompt and answer")
        return fitting[-1]

    def samples(self, tokenizer, length: int, limit: int | None = None, seed: int = 42) -> list[Sample]:
        """Books × tests × depths in upstream's order (the first ``limit``); the seed is upstream's own (its base seed
        42), not the run's."""
        needle_set, template, *books = self.sources
        found = tests(read_records(fetch(needle_set, self.data_dir)), self.name,
                      lambda: task_template(fetch(template, self.data_dir)))
        context = self.context_length(tokenizer, found, length)
        result: list[Sample] = []
        for number, (filename, book_source) in enumerate(zip(BOOKS, books)):
            path = fetch(book_source, self.data_dir)
            book = _book(tokenizer, str(path), path.stat().st_mtime_ns)
            for test in found:
                draws = np.random.RandomState(test["seed"] + number)
                for step, depth in enumerate(DEPTHS):
                    if limit is not None and len(result) >= limit:
                        return result
                    needle, question, gold = test["needle"], test["question"], test["gold"]
                    if "{CHAR}" in needle:
                        if not test["characters"]:
                            raise ValueError(f"{self.name}: test {test['name']} has a {{CHAR}} needle and no "
                                             "character set")
                        character = str(draws.choice(test["characters"]))
                        needle, question, gold = needle.replace("{CHAR}", character), question.replace(
                            "{CHAR}", character), [character]
                    haystack = book.haystack(needle, context, depth / 100)
                    ids = render_messages(tokenizer, self.messages(test["template"], haystack, question))
                    metadata = {"test": test["name"], "question_type": test["question_type"], "book": filename,
                                "depth": float(depth), "context_length": context, "category": self.category}
                    sample_id = f"{test['name']}:{number + 1}:{step}"
                    result.append(Sample(sample_id, ids, MAX_NEW_TOKENS, list(gold), metadata))
        return result

    def score(self, prediction: str, sample: Sample) -> float:
        return contains(prediction, sample.references)

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, float]:
        """Accuracy in percent (2 decimals), overall and per question type (``score_onehop``, ``score_twohop``)."""
        metrics = super().aggregate(records)
        for kind in ("onehop", "twohop"):
            scores = [r["score"] for r in records if r["metadata"]["question_type"] == kind]
            metrics[f"score_{kind}"] = round(100 * sum(scores) / len(scores), 2) if scores else float("nan")
        return metrics


def _register(task: str, needle_set: str, description: str) -> None:
    sources = (_source(f"needlesets/{needle_set}", f"NoLiMa needle set {needle_set}"), TEMPLATE,
               *(_source(f"haystack/rand_shuffle/{b}", f"NoLiMa haystack {b}") for b in BOOKS))
    register(task, group="nolima")(type(f"NoLiMa_{task}", (NoLiMa,), {"needle_set": needle_set, "sources": sources,
                                                                      "__doc__": description}))


_register("nolima", "needle_set.json", "NoLiMa's main needle set (58 question-needle pairs, one- and two-hop).")
_register("nolima_hard", "needle_set_hard.json", "NoLiMa-Hard: the 10 hardest question-needle pairs.")
