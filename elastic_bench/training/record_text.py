"""What a router-training record task is (`RecordTask`, `TextTask`) and the text its records read: a corpus
(`CorpusText`) or generated reports (`GeneratedText`), handed out as windows of sentences.

Used by `elastic_bench.training.make_records` (the tasks and the records) and `elastic_bench.training.labelled_tasks`
(the tasks with the paper's labels).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from elastic_bench.tasks import ruler_data

from . import world

Category = Literal["sensitive", "robust"]
CATEGORIES: tuple[str, ...] = get_args(Category)
PARAGRAPH_SENTENCES = 16  # a corpus paragraph longer than this is cut into pieces of at most this many sentences

Window = list[tuple[str, bool]]
"""Sentences of a text in order, each with whether its paragraph ends after it."""


# ---- text ----------------------------------------------------------------------------------------------------------


class GeneratedText:
    """Generated local news reports of a made-up world (`elastic_bench.training.world.report`: a lead sentence about a
    town, then facts about its people), one a paragraph: the text when no corpus is given.

    Attributes:
        identity: what a record whose answer comes from this text draws on (`RecordTask.identities`).
    """

    description = "generated reports"
    identity = "generator:records.reports"

    def paragraphs(self, place: int) -> Iterator[list[str]]:
        """Endless paragraphs (lists of sentences), the same for the same ``place``."""
        rng = np.random.default_rng(place)
        while True:
            yield world.report(rng)


class CorpusText:
    """A corpus: a ``.txt`` file or a folder of them (every one below it, in path order), read whole.

    Its paragraphs are its blank-line-separated blocks (whitespace collapsed), split into sentences by nltk's punkt as
    RULER splits its essays (`elastic_bench.tasks.ruler_data.sentence_splitter`: the model under
    ``<data_dir>/nltk_data`` or in nltk's own paths) and cut into pieces of at most `PARAGRAPH_SENTENCES` sentences.
    Its ``identity`` is ``corpus:`` and the first 16 hex digits of the SHA-256 of its text: nothing tells what a corpus
    is, so it matches no benchmark's identity.

    Raises:
        FileNotFoundError: ``path`` does not exist, the folder holds no ``.txt`` file, or punkt is missing.
        ValueError: the files are not UTF-8 text, or hold no text.
    """

    def __init__(self, path: str | Path, data_dir: str | None = None):
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"--corpus: no file or folder at {path}")
        files = sorted(path.rglob("*.txt")) if path.is_dir() else [path]
        if not files:
            raise FileNotFoundError(f"--corpus: the folder {path} holds no .txt file")
        blocks = []
        for file in files:
            try:
                content = file.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"--corpus: {file} is not UTF-8 text") from None
            blocks += [" ".join(block.split()) for block in re.split(r"\n\s*\n", content)]
        self.blocks = [block for block in blocks if block]
        if not self.blocks:
            raise ValueError(f"--corpus: {path} holds no text")
        self.description = f"the corpus {path}"
        self.identity = "corpus:" + hashlib.sha256("\n\n".join(self.blocks).encode()).hexdigest()[:16]
        self._split = ruler_data.sentence_splitter(data_dir)
        self._sentences: dict[int, list[str]] = {}

    def paragraphs(self, place: int) -> Iterator[list[str]]:
        """Endless paragraphs (lists of sentences) from block ``place`` (modulo the number of blocks) on; the corpus
        wraps around."""
        block = place % len(self.blocks)
        while True:
            if block not in self._sentences:
                self._sentences[block] = self._split(self.blocks[block])
            sentences = self._sentences[block]
            for start in range(0, len(sentences), PARAGRAPH_SENTENCES):
                yield sentences[start : start + PARAGRAPH_SENTENCES]
            block = (block + 1) % len(self.blocks)


Text = GeneratedText | CorpusText


def window(paragraphs: Sequence[list[str]]) -> Window:
    """``paragraphs`` as a `Window`."""
    return [(sentence, i == len(p) - 1) for p in paragraphs for i, sentence in enumerate(p)]


def sentences(text: Text, place: int, count: int) -> Window:
    """The first ``count`` sentences of ``text`` from ``place`` (the last paragraph cut where the count ends)."""
    paragraphs, total = [], 0
    for paragraph in text.paragraphs(place):
        if total >= count:
            break
        paragraphs.append(paragraph)
        total += len(paragraph)
    return window(paragraphs)[:count]


def insert(window: Window, inserts: list[tuple[int, str]]) -> Window:
    """``window`` with each ``(position, sentence)`` inserted before its sentence ``position`` (at the end for
    ``len(window)``), in the paragraph of that sentence; inserts at one position keep their order."""
    out = list(window)
    for shift, (position, sentence) in enumerate(sorted(inserts, key=lambda item: item[0])):
        out.insert(position + shift, (sentence, False))
    return out


def render(window: Window) -> str:
    """Sentences joined by a space within a paragraph and by a blank line between paragraphs."""
    return "".join(sentence + ("\n\n" if end else " ") for sentence, end in window).strip()


def stream_seed(*parts: Any) -> int:
    """A 63-bit seed that is a pure function of ``parts``."""
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "little") >> 1


# ---- tasks ---------------------------------------------------------------------------------------------------------


class RecordTask:
    """One kind of record: its name, category, label and sources, and how a record of a given size is built.

    Attributes:
        name: the task's name (a record's ``task`` field).
        category: ``"sensitive"`` or ``"robust"``.
        label: the paper's task label it stands for (`elastic_bench.training.records.PAPER_LABELS`), or None where
            none fits (aggregation, copying).
        generator: the identity of its generator (``generator:records.<name>``); see `identities`.
    """

    name: str = ""
    category: Category = "sensitive"
    label: str | None = None
    generator: str = ""

    @property
    def identities(self) -> frozenset[str]:
        """What its questions and answers come from (`elastic_bench.tasks.Task.identities`): its generator."""
        return frozenset({self.generator})

    def prepare(self, tokenizer, length: int, seed: int) -> None:
        """Load what every record of a (tokenizer, length, seed) needs; called before `build`."""

    def min_units(self, index: int) -> int:
        """The smallest size of record ``index``, in the task's unit."""
        return 1

    def build(self, units: int, index: int, seed: int, length: int) -> tuple[str, str]:
        """Record ``index`` with a context of ``units``: ``(prompt, answer)``, a pure function of the arguments once
        `prepare` has run."""
        raise NotImplementedError


class TextTask(RecordTask):
    """A task over a text (its unit: sentences of that text, unless it says otherwise).

    Attributes:
        answers_from_text: whether its answers come from the text itself (then the text's identity is one of the
            task's), rather than from what the task inserts into it (a text that only pads).
    """

    answers_from_text = False

    def __init__(self, text: Text):
        self.text = text

    @property
    def identities(self) -> frozenset[str]:
        return super().identities | ({self.text.identity} if self.answers_from_text else set())

    @staticmethod
    def _rng(seed: int, index: int) -> tuple[np.random.Generator, int]:
        """Record ``index``'s random stream and its place in the text."""
        rng = np.random.default_rng([seed, index])
        return rng, int(rng.integers(1 << 62))
