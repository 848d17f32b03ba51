"""Training records made by the project for any model: prompts whose answer sparse attention loses (category
``sensitive``) and prompts that a local window serves (category ``robust``), at lengths measured with the model's own
tokenizer. ``elastic-bench records`` (`elastic_bench.method.router_records`) writes them for a model; ``train-router
--data`` trains the router on them (targets: ΩMSR 0.7 and 1.0, `elastic_bench.method.data.DEFAULT_TARGETS`), and
``train-duo`` / ``train-prulong --records`` read them too. docs/records.md says why each task is in its category and
why the default ones share no source with a benchmark.

Tasks (`task_names`; each with its category, the paper's label where one fits, and its identities):

- The default set (`DEFAULT_TASKS`, `elastic_bench.training.labelled_tasks`): ``single_qa``, ``multihop_qa``
  (sensitive), ``summary``, ``code``, ``icl`` (robust): the paper's five labels, from generated text, invented facts,
  the Python standard library and invented tags, none of which a registered benchmark draws on.
- Selectable by name (``--tasks``): tasks that share a benchmark's generator, so that a router trained on them is
  in-distribution for it (`elastic_bench.training.provenance`):
  - ``ruler_niah_*``: RULER's eight needle-in-a-haystack configurations; ``ruler_vt``: variable tracking (multi-hop);
    ``ruler_cwe`` / ``ruler_fwe``: the most frequent words of the whole context. Built by RULER's own generators
    (`elastic_bench.tasks.ruler`), the essay haystack drawn from the text below; RULER's qa tasks are left out (they
    need downloaded SQuAD / HotpotQA).
  - ``recent_needle`` (robust): four needles in the testbed's phrasing, the one asked for among the last eight
    sentences: a retrieval prompt that a local window answers.
- Also selectable: ``passkey`` (sensitive): DuoAttention's multi-passkey retrieval (its gate-training data, which
  ``train-duo`` shares) as a question: four passkeys of eight words at depths 5-95 % of the text, numbered in order,
  one of them asked for (its own phrasing: `elastic_bench.baselines.training.passkeys` rebuilds upstream's
  token-level samples for the gate trainers, and the training side may not import the baselines);
  ``continuation`` / ``repeat`` (robust): the text's next one or two sentences, or its last one to three again.

Design decisions:

- Text: a corpus (`CorpusText`: a ``.txt`` file or a folder of them) or, without one, generated reports
  (`GeneratedText`). Each record reads from its own place in the text.
- Length: what a trainer feeds for the record (`record_tokens`: the prompt through the chat template, the answer,
  EOS). A record holds the largest context (sentences, paragraphs, code lines, examples or RULER's unit) that keeps
  it within the requested length (`elastic_bench.tasks.ruler.largest_fitting`). A task whose smallest record is
  longer than a length is left out at that length (RULER's vt and cwe carry a one-shot example of several hundred
  tokens); a length that none of a category's tasks fits is an error.
- Labels exist without a model: an inserted fact, the text's own next or last sentences, a paragraph's lead, the next
  line of a module; a RULER answer is its answer prefix followed by its answers (joined as RULER's one-shot examples
  join them).
- Balance: at every length each category has the same number of records, which cycle over its tasks.
- Seeds: a record is a pure function of (seed, task, length, index), the tokenizer and (``code``) the interpreter's
  standard library; RULER's generators get seeds derived from these, never RULER's evaluation seed (42), so no
  record is an evaluation prompt.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

import numpy as np

from elastic_bench import tasks as task_registry
from elastic_bench.foundation.registry import did_you_mean
from elastic_bench.tasks import LengthTooShortError, ruler
from elastic_bench.testbed import text as testbed_text
from elastic_bench.testbed.generators import SPECS as TESTBED_SPECS
from elastic_bench.training.engine import tokenize
from elastic_bench.training.records import Example

from .labelled_tasks import Code, FewShotTags, MultiHopQA, SingleQA
from .record_text import CATEGORIES, RecordTask, Text, TextTask, insert, render, sentences, stream_seed, window

RECENT_SENTENCES = 8  # recent_needle: the needle asked for sits among the context's last sentences
PASSKEYS, PASSKEY_WORDS = 4, 8
NEEDLES = 4  # recent_needle: the needle asked for and three distractors
COUNTS = {1: "sentence", 2: "two sentences", 3: "three sentences"}
DEFAULT_TASKS = ("single_qa", "multihop_qa", "summary", "code", "icl")
"""What ``elastic-bench records`` writes by default: the paper's five labels, disjoint from every benchmark."""
PASSKEY_GENERATOR = "generator:duo.passkey"  # DuoAttention's passkey retrieval: `passkey` and train-duo's data
RULER_LABELS = {"niah": "Single QA", "variable_tracking": "MultiHop QA"}  # the paper label a RULER generator fits

PASSKEY_NEEDLE = "Remember this sequence of words, it is passkey number {number} to the vault: {passkey}."
PASSKEY_PROMPT = (
    "This is a very long story book: <book> {context} </book>.\n\nBased on the content of the book, what is passkey "
    "number {number} to the vault?"
)
PASSKEY_ANSWER = "Passkey number {number} to the vault is: {passkey}."
CONTINUATION_PROMPT = "Read the following text.\n\n{context}\n\nContinue the text: write its next {count}."
REPEAT_PROMPT = (
    "Read the following text. I will ask you to repeat the end of it afterwards.\n\n{context}\n\nRepeat the last "
    "{count} of the text."
)
SUMMARY_PROMPT = "Read the following text.\n\n{context}\n\nSummarize the last paragraph of the text in one sentence."


# ---- tasks ---------------------------------------------------------------------------------------------------------


class Passkey(TextTask):
    """DuoAttention's multi-passkey retrieval: `PASSKEYS` passkeys of `PASSKEY_WORDS` testbed nouns at depths drawn
    from 5-95 % of the text, numbered in text order; the question asks for one."""

    name, category, label, generator = "passkey", "sensitive", "Single QA", PASSKEY_GENERATOR

    def build(self, units, index, seed, length):
        rng, place = self._rng(seed, index)
        nouns = testbed_text.NOUNS
        passkeys = [" ".join(nouns[i] for i in rng.integers(len(nouns), size=PASSKEY_WORDS)) for _ in range(PASSKEYS)]
        depths = np.sort(rng.uniform(0.05, 0.95, PASSKEYS))
        asked = int(rng.integers(PASSKEYS))
        text = sentences(self.text, place, units)
        needles = [(int(depth * len(text)), PASSKEY_NEEDLE.format(number=i + 1, passkey=passkey))
                   for i, (depth, passkey) in enumerate(zip(depths, passkeys))]
        prompt = PASSKEY_PROMPT.format(context=render(insert(text, needles)), number=asked + 1)
        return prompt, PASSKEY_ANSWER.format(number=asked + 1, passkey=passkeys[asked])


class Continuation(TextTask):
    """Continue the text: the answer is its next one or two sentences."""

    name, category, generator, answers_from_text = "continuation", "robust", "generator:records.continuation", True

    def build(self, units, index, seed, length):
        rng, place = self._rng(seed, index)
        count = int(rng.integers(1, 3))
        text = sentences(self.text, place, units + count)
        answer = " ".join(sentence for sentence, _ in text[units:])
        return CONTINUATION_PROMPT.format(context=render(text[:units]), count=COUNTS[count]), answer


class Repeat(TextTask):
    """Repeat the text's last one to three sentences."""

    name, category, generator, answers_from_text = "repeat", "robust", "generator:records.repeat", True

    def min_units(self, index):
        return max(COUNTS)

    def build(self, units, index, seed, length):
        rng, place = self._rng(seed, index)
        count = int(rng.integers(1, max(COUNTS) + 1))
        text = sentences(self.text, place, units)
        answer = " ".join(sentence for sentence, _ in text[-count:])
        return REPEAT_PROMPT.format(context=render(text), count=COUNTS[count]), answer


class Summary(TextTask):
    """Summarise the last paragraph in one sentence: the answer is its first sentence, its lead (unit:
    paragraphs)."""

    name, category, label, generator = "summary", "robust", "Summarization", "generator:records.summary"
    answers_from_text = True

    def build(self, units, index, seed, length):
        _, place = self._rng(seed, index)
        paragraphs = list(islice(self.text.paragraphs(place), units))
        return SUMMARY_PROMPT.format(context=render(window(paragraphs))), paragraphs[-1][0]


class RecentNeedle(TextTask):
    """`NEEDLES` needles in the testbed's phrasing (pseudo-word keys, 7-digit values; `elastic_bench.testbed.text`),
    the one asked for among the last `RECENT_SENTENCES` sentences, the others anywhere: the testbed's ``niah_recent``
    generator, whose identity it has."""

    name, category = "recent_needle", "robust"

    @property
    def identities(self):
        return TESTBED_SPECS["niah_recent"].identities

    def build(self, units, index, seed, length):
        rng, place = self._rng(seed, index)
        keys = [testbed_text.keys()[i] for i in rng.choice(len(testbed_text.keys()), NEEDLES, replace=False)]
        values = [int(v) for v in rng.integers(10**6, 10**7, size=NEEDLES)]
        recent, anywhere = rng.uniform(), rng.uniform(size=NEEDLES - 1)
        text = sentences(self.text, place, units)
        size = len(text)
        positions = [size - int(recent * min(RECENT_SENTENCES, size)), *(int(f * size) for f in anywhere)]
        needles = [(p, testbed_text.NEEDLE.format(key=k, value=v)) for p, k, v in zip(positions, keys, values)]
        prompt = (f"{testbed_text.RECENT_INSTRUCTION}\n\n{render(insert(text, needles))}\n\n"
                  f"{testbed_text.RECENT_QUESTION.format(key=keys[0])}")
        return prompt, f"{testbed_text.RECENT_PREFIX.format(key=keys[0])} {values[0]}."


class _TextNiah(ruler.Niah):
    """RULER's niah generator with its essay haystack drawn from a text, each sample from its own place (unit:
    sentences)."""

    def __init__(self, name: str, args: dict, text: Text):
        super().__init__()
        self.name, self.args, self.text, self._place = name, args, text, 0

    def prepare(self, tokenizer, length, seed):
        """Nothing to load: the haystack is the text."""

    def build(self, units, index, seed, length):
        self._place = stream_seed(seed, index)
        return super().build(units, index, seed, length)

    def essay_sentences(self, units):
        return [sentence for sentence, _ in sentences(self.text, self._place, units)]


class RulerTask(RecordTask):
    """A RULER task as records: its user text is the prompt; its answer prefix followed by its answers, the answer;
    its identities are the RULER task's (`elastic_bench.tasks.ruler.Ruler.identities_for`)."""

    category = "sensitive"

    def __init__(self, task: ruler.Ruler):
        self.task, self.name = task, task.name
        self.label = RULER_LABELS.get(task.generator)

    @property
    def identities(self):
        return type(self.task).identities_for(self.task.args)

    def prepare(self, tokenizer, length, seed):
        self.task.prepare(tokenizer, length, seed)

    def min_units(self, index):
        return self.task.min_units(index)

    def build(self, units, index, seed, length):
        user, prefix, answers = self.task.build(units, index, seed, length)
        if self.task.generator == "common_words_extraction":  # numbered, as in cwe's one-shot example
            joined = " ".join(f"{i + 1}. {word}" for i, word in enumerate(answers))
        else:  # vt's one-shot example separates its variables with spaces
            joined = (" " if self.task.generator == "variable_tracking" else ", ").join(answers)
        return user, f"{prefix.strip()} {joined}"


TEXT_TASKS: dict[str, type[TextTask]] = {
    cls.name: cls for cls in (SingleQA, MultiHopQA, Passkey, Continuation, Repeat, Summary, RecentNeedle)
}
OWN_DATA_TASKS: dict[str, type[RecordTask]] = {cls.name: cls for cls in (Code, FewShotTags)}  # read no text


def task_names() -> dict[str, str]:
    """Every record task's name → its category, the sensitive ones first: the RULER configurations but qa, then
    `TEXT_TASKS` and `OWN_DATA_TASKS`."""
    configs = ruler.official_configs()
    names = {f"ruler_{name}": "sensitive" for name, config in configs.items() if config["task"] != "qa"}
    names.update({name: cls.category for name, cls in {**TEXT_TASKS, **OWN_DATA_TASKS}.items()})
    return {name: names[name] for category in CATEGORIES for name in names if names[name] == category}


def make_task(name: str, text: Text, data_dir: str | None = None) -> RecordTask:
    """The record task ``name`` (`task_names`) over ``text``; RULER's data (cwe's long word list) from ``data_dir``.

    Raises:
        UnknownNameError: ``name`` is not a record task.
    """
    if name in TEXT_TASKS:
        return TEXT_TASKS[name](text)
    if name in OWN_DATA_TASKS:
        return OWN_DATA_TASKS[name]()
    if name not in task_names():
        raise did_you_mean("record task", name, list(task_names()))
    config = ruler.official_configs()[name.removeprefix("ruler_")]
    if config["task"] == "niah" and config["args"]["type_haystack"] == "essay":
        return RulerTask(_TextNiah(name, config["args"], text))
    return RulerTask(task_registry.get(name, data_dir=data_dir))


# ---- records -------------------------------------------------------------------------------------------------------


def record_tokens(tokenizer, prompt: str, answer: str) -> int:
    """The tokens a trainer feeds for a record: the prompt through the chat template, the answer, EOS
    (`elastic_bench.training.engine.tokenize`, untruncated)."""
    return len(tokenize([Example(prompt, answer, "")], tokenizer, [""], sys.maxsize)[0].input_ids)


def default_lengths(positions: int, shortest: int = 1024, longest: int = 32768) -> list[int]:
    """Record lengths spread over a model's context: powers of two from ``shortest`` up to the top, then the top, the
    model's ``positions`` capped at ``longest`` (the top alone when it is below ``shortest``)."""
    top = min(positions, longest)
    lengths = [shortest << i for i in range(64) if shortest << i < top]
    return [*lengths, top]


def router_records(tokenizer, lengths: Sequence[int], samples: int, tasks: Sequence[RecordTask], seed: int = 0,
                   left_out: list[tuple[str, int, int | None]] | None = None) -> Iterator[dict[str, Any]]:
    """Records of ``tasks`` for ``tokenizer``: at each length, ``samples`` per category, interleaved; record ``i`` of
    a category of ``n`` tasks is record ``i // n`` of its task ``i % n``.

    Each record is a plain record (`elastic_bench.training.records`) with ``task``, its ``label`` and
    ``identities`` (`RecordTask`), ``length`` (the requested one) and ``tokens`` (its `record_tokens`, at most
    ``length``). A task whose smallest record is longer than a length is
    left out at that length (the other tasks of its category take its turns) and noted in ``left_out`` as ``(task,
    length, tokens of its smallest record)``, None for the tokens of a task that builds no record that short.

    Raises:
        ValueError: no task of a category fits a length with this tokenizer.
    """
    for length in lengths:
        groups = []
        for category in CATEGORIES:
            members, smallest = [], {}
            for task in (t for t in tasks if t.category == category):
                task.prepare(tokenizer, length, stream_seed(seed, task.name, length))
                try:
                    smallest[task.name] = _build(task, tokenizer, task.min_units(0), 0, seed, length)[2]
                except LengthTooShortError:  # a generator that builds nothing this short (its message says why)
                    smallest[task.name] = None
                if smallest[task.name] is not None and smallest[task.name] <= length:
                    members.append(task)
                elif left_out is not None:
                    left_out.append((task.name, length, smallest[task.name]))
            if smallest and not members:
                sizes = ", ".join(f"{name} {'none at this length' if tokens is None else tokens}"
                                  for name, tokens in smallest.items())
                raise ValueError(f"no {category} task fits a length of {length} tokens with this tokenizer; their "
                                 f"smallest records take: {sizes}")
            groups += [members] if members else []
        fitted: dict[str, int] = {}  # task → the size of its last record at this length: the next search starts there
        for i in range(samples):
            for members in groups:
                yield _record(members[i % len(members)], tokenizer, length, seed, i // len(members), fitted)


def _build(task: RecordTask, tokenizer, units: int, index: int, seed: int, length: int) -> tuple[str, str, int]:
    """``(prompt, answer, record_tokens)`` of record ``index`` of ``task`` with a context of ``units``."""
    prompt, answer = task.build(units, index, stream_seed(seed, task.name, length), length)
    return prompt, answer, record_tokens(tokenizer, prompt, answer)


def _record(task: RecordTask, tokenizer, length: int, seed: int, index: int, fitted: dict[str, int]) -> dict[str, Any]:
    """Record ``index`` of ``task`` with the largest context that keeps it within ``length`` tokens."""
    built: dict[int, tuple[str, str, int]] = {}

    def fits(units: int) -> bool:
        if units not in built:
            built[units] = _build(task, tokenizer, units, index, seed, length)
        return built[units][2] <= length

    smallest = task.min_units(index)
    if not fits(smallest):
        raise ValueError(f"{task.name}: record {index} at {length} tokens: its smallest form takes "
                         f"{built[smallest][2]} tokens with this tokenizer")
    units = ruler.largest_fitting(fits, smallest, None, fitted.get(task.name, 2))
    fitted[task.name] = units
    prompt, answer, tokens = built[units]
    return {"prompt": prompt, "answer": answer, "category": task.category, "task": task.name, "label": task.label,
            "identities": sorted(task.identities), "length": length, "tokens": tokens}
