"""The record tasks of ``elastic-bench records``' default set, one per label of the paper's training mixture, made of
sources that no registered benchmark uses (docs/records.md says why each is disjoint from them):

- ``single_qa`` (Single QA, sensitive): facts about an invented person inserted anywhere into the text (generated
  reports of a made-up world, `elastic_bench.training.world`, or a corpus); the question asks one of them back.
- ``multihop_qa`` (MultiHop QA, sensitive): a relation from one invented person to another and a fact about the second,
  each anywhere in the text, beside a distractor chain of another relation; the question asks the fact through the
  relation.
- ``summary`` (Summarization, robust) is `elastic_bench.training.make_records.Summary`.
- ``code`` (Code, robust): consecutive lines of the Python standard library's own modules (the interpreter's ``.py``
  files, PSF licence); the answer is the next non-empty line.
- ``icl`` (In-Context Learning, robust): sentences tagged with invented words by what they are about (a fruit, a
  tool, ...), a new mapping per record; the answer is the tag of a last, untagged sentence, whose kind is among the
  last examples'.
"""

from __future__ import annotations

import sysconfig
from functools import lru_cache
from pathlib import Path

import numpy as np

from elastic_bench.tasks import python_source

from . import world
from .record_text import RecordTask, TextTask, insert, render, sentences

SINGLE_QA_PROMPT = (
    "Below are local news reports. Read them carefully: a question about one of the people in them follows.\n\n"
    "{context}\n\nQuestion: {question}"
)
MULTIHOP_QA_PROMPT = (
    "Below are local news reports. Read them carefully: a question follows, and answering it takes two facts "
    "from different places.\n\n{context}\n\nQuestion: {question}"
)
CODE_PROMPT = ("Below is a part of a Python module of the standard library. Write the next non-empty line of the "
               "code.\n\n```python\n{code}\n```")
ICL_PROMPT = ("Every sentence below has a tag, and the tag follows from what the sentence is about. Give the tag of "
              "the last sentence.\n\n{examples}\n\nSentence: {query}\nTag?")
ICL_EXAMPLE = "Sentence: {sentence}\nTag: {tag}"
LONGEST_CODE_LINE = 200  # characters: a module with a longer line is left out (a line is the code task's unit)
ICL_KINDS = {
    "fruit": ("plum", "apricot", "quince", "fig", "cherry", "melon", "pear", "lime"),
    "tool": ("hammer", "chisel", "wrench", "trowel", "saw", "spanner", "drill", "rake"),
    "animal": ("otter", "heron", "badger", "lynx", "tortoise", "ferret", "gecko", "moose"),
    "vehicle": ("tram", "canoe", "scooter", "wagon", "ferry", "sledge", "tractor", "glider"),
    "garment": ("scarf", "waistcoat", "apron", "mitten", "cardigan", "bonnet", "poncho", "sandal"),
    "instrument": ("cello", "oboe", "harp", "bassoon", "zither", "trumpet", "viola", "flute"),
}
ICL_SENTENCES = (
    "Someone left a {word} by the door.", "The shop sold its last {word} before noon.",
    "She drew a {word} in the margin of her notebook.", "A {word} appeared in the old photograph.",
    "He wrote a short poem about a {word}.", "The children argued about the {word} all afternoon.",
)
ICL_TAGS = 4  # kinds, and invented tags, per record
ICL_RECENT = 8  # the last sentence's kind is that of one of the last examples


def _fresh_person(rng: np.random.Generator, taken: str) -> str:
    """An invented name that does not occur in ``taken``."""
    while True:
        name = world.person(rng)
        if name not in taken:
            return name


class SingleQA(TextTask):
    """One to three facts about one invented person at depths drawn uniformly over the text; one is asked for."""

    name, category, label, generator = "single_qa", "sensitive", "Single QA", "generator:records.single_qa"

    def build(self, units, index, seed, length):
        rng, place = self._rng(seed, index)
        window = sentences(self.text, place, units)
        subject = _fresh_person(rng, render(window))
        kinds = rng.choice(len(world.ATTRIBUTES), size=int(rng.integers(1, 4)), replace=False)
        facts = [world.ATTRIBUTES[k].fact(subject, world.ATTRIBUTES[k].value(rng)) for k in kinds]
        context = render(insert(window, [(int(rng.uniform() * len(window)), fact) for fact in facts]))
        question = world.ATTRIBUTES[kinds[0]].question.format(subject=subject)
        return SINGLE_QA_PROMPT.format(context=context, question=question), facts[0]


class MultiHopQA(TextTask):
    """``a → b`` by one relation and a fact about ``b``, beside ``a → c`` by another and the same kind of fact about
    ``c`` (another value), each at a depth drawn uniformly over the text; the question asks the fact of ``b``
    through the first relation."""

    name, category, label, generator = "multihop_qa", "sensitive", "MultiHop QA", "generator:records.multihop_qa"

    def build(self, units, index, seed, length):
        rng, place = self._rng(seed, index)
        window = sentences(self.text, place, units)
        taken = render(window)
        a = _fresh_person(rng, taken)
        b = _fresh_person(rng, taken + a)
        c = _fresh_person(rng, taken + a + b)
        relation, other = (world.RELATIONS[i] for i in rng.choice(len(world.RELATIONS), 2, replace=False))
        attribute = world.ATTRIBUTES[int(rng.integers(len(world.ATTRIBUTES)))]
        value = attribute.value(rng)
        decoy = value
        while decoy == value:
            decoy = attribute.value(rng)
        hop, fact = relation.statement.format(a=a, b=b), attribute.fact(b, value)
        facts = [hop, fact, other.statement.format(a=a, b=c), attribute.fact(c, decoy)]
        context = render(insert(window, [(int(rng.uniform() * len(window)), f) for f in facts]))
        question = attribute.question.format(subject=relation.phrase.format(a=a))
        return MULTIHOP_QA_PROMPT.format(context=context, question=question), f"{hop} {fact}"


@lru_cache(maxsize=1)
def stdlib_lines() -> tuple[str, ...]:
    """The lines of the Python standard library's top-level modules (``<stdlib>/*.py``, sorted by name; a module
    with a line longer than `LONGEST_CODE_LINE` characters, or not UTF-8, is left out), each module opened by a
    ``# file: <name>`` line.

    Raises:
        FileNotFoundError: the interpreter ships no ``.py`` files of its standard library.
    """
    folder = Path(sysconfig.get_paths()["stdlib"])
    lines = python_source.stream(python_source.read_files(folder, sorted(folder.glob("*.py")), LONGEST_CODE_LINE))
    if not any(line.strip() for line in lines):
        raise FileNotFoundError(f"the code records read the Python standard library's .py files, and {folder} holds "
                                "none (a Python without its library's sources)")
    return lines


class Code(RecordTask):
    """``units`` consecutive lines of the standard library from a seeded place (wrapping around its end); the answer
    is the next non-empty line (unit: lines)."""

    name, category, label, generator = "code", "robust", "Code", "generator:records.code"

    @property
    def identities(self):
        return super().identities | {"dataset:python_stdlib"}

    def prepare(self, tokenizer, length, seed):
        stdlib_lines()

    def build(self, units, index, seed, length):
        lines = stdlib_lines()
        start = int(np.random.default_rng([seed, index]).integers(len(lines)))
        code = "\n".join(lines[(start + i) % len(lines)] for i in range(units))
        after = start + units
        while not lines[after % len(lines)].strip():
            after += 1
        return CODE_PROMPT.format(code=code), lines[after % len(lines)]


class FewShotTags(RecordTask):
    """`ICL_TAGS` kinds of `ICL_KINDS`, each tagged by an invented word; ``units`` tagged sentences, each about a word
    of a kind drawn at random; the last sentence is about another word of the kind of one of the last `ICL_RECENT`
    (unit: examples)."""

    name, category, label, generator = "icl", "robust", "In-Context Learning", "generator:records.icl"

    def build(self, units, index, seed, length):
        rng = np.random.default_rng([seed, index])
        kinds = [list(ICL_KINDS)[k] for k in rng.choice(len(ICL_KINDS), ICL_TAGS, replace=False)]
        tags: list[str] = []
        while len(tags) < ICL_TAGS:
            tag = world.SYLLABLES[int(rng.integers(len(world.SYLLABLES)))] + world.SYLLABLES[
                int(rng.integers(len(world.SYLLABLES)))]
            tags += [tag] if tag not in tags else []
        drawn = []  # (kind, word, sentence) of each example, drawn in turn: a longer record extends a shorter one
        for _ in range(units):
            kind = int(rng.integers(ICL_TAGS))
            word = str(rng.choice(ICL_KINDS[kinds[kind]]))
            drawn.append((kind, word, str(rng.choice(ICL_SENTENCES)).format(word=word)))
        examples = [ICL_EXAMPLE.format(sentence=sentence, tag=tags[kind]) for kind, _, sentence in drawn]
        kind, seen, _ = drawn[units - 1 - int(rng.integers(min(units, ICL_RECENT)))]
        word = str(rng.choice([w for w in ICL_KINDS[kinds[kind]] if w != seen]))
        query = str(rng.choice(ICL_SENTENCES)).format(word=word)
        return ICL_PROMPT.format(examples="\n\n".join(examples), query=query), tags[kind]
