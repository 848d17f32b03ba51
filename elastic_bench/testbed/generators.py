"""The testbed's task generators: RULER-style prompts built directly as token ids of the testbed vocabulary.

Two families, each recognisable from a prompt's first and last 100 tokens (the instruction opens the prompt; the
question and the answer prefix close it):

- **sensitive** (the answer sits anywhere in the context; sparse attention that drops the middle loses it):
  ``niah_single`` (one needle), ``niah_multikey`` (four needles with distinct keys, one queried: three distractors);
- **robust** (the answer sits in the last few hundred tokens): ``niah_recent`` (four needles, the queried one within
  the last ~100 tokens of the context), ``repeat`` (copy the context's last sentence: six haystack words in random
  order).

A needle is RULER's ``"One of the special magic numbers for {key} is {value}."`` with a pseudo-word key and a 7-digit
value; the haystack is RULER-style noise, sentences ``"The {noun} is {adjective}."`` and ``"The {noun} {verb}."``,
filled to hit the target length exactly. Everything is drawn from a `numpy.random.Generator`, so a sample is a pure
function of its seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from . import text
from .vocab import Vocab

CATEGORIES = ("sensitive", "robust")
MAX_NEW_TOKENS = 16  # generation budget: a 7-digit answer or six words, the full stop and </s>
RECENT_SENTENCES = 16  # the robust needle sits within this many haystack sentences of the context's end
REPEAT_WORDS = 6
PROMPT_WEIGHT = 0.1  # training-loss weight of the question and answer-prefix tokens (answer tokens weigh 1)
MAX_FOLLOWUPS = 3  # training-time questions about distractor needles, after the answer


@dataclass(frozen=True)
class TaskSpec:
    """One testbed task.

    Attributes:
        name: task name (registered as ``testbed_<name>``).
        category: ``"sensitive"`` or ``"robust"``.
        instruction, question, prefix: the template texts (``{key}`` is the queried key).
        num_needles: key-value needles in the haystack (0 for ``repeat``).
        recent: the queried needle sits near the end of the context.
        followups: in training, after the answer, up to `MAX_FOLLOWUPS` other needles are queried too (more answer
            tokens per sequence; prompts for evaluation never have them).
    """

    name: str
    category: str
    instruction: str
    question: str
    prefix: str
    num_needles: int
    recent: bool = False
    followups: bool = False

    @property
    def identities(self) -> frozenset[str]:
        """The task's generator, ``generator:testbed.<name>`` (`elastic_bench.tasks.Task.identities`): what the
        registered task, ``testbed data`` records and ``testbed train`` batches of it share."""
        return frozenset({f"generator:testbed.{self.name}"})


SPECS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec("niah_single", "sensitive", text.NIAH_INSTRUCTION_SINGLE, text.NIAH_QUESTION, text.NIAH_PREFIX, 1),
        TaskSpec("niah_multikey", "sensitive", text.NIAH_INSTRUCTION_MULTI, text.NIAH_QUESTION, text.NIAH_PREFIX, 4,
                 followups=True),
        TaskSpec("niah_recent", "robust", text.RECENT_INSTRUCTION, text.RECENT_QUESTION, text.RECENT_PREFIX, 4,
                 recent=True),
        TaskSpec("repeat", "robust", text.REPEAT_INSTRUCTION, text.REPEAT_QUESTION, text.REPEAT_PREFIX, 0),
    )
}


@dataclass
class Example:
    """One generated sample, as token ids of the testbed vocabulary (no ``<s>``/``</s>``).

    The prompt is ``<s> instruction context question prefix``; the model continues with ``answer </s>``.
    ``followups`` are further ``(question + prefix, answer)`` turns appended in training only.
    """

    spec: TaskSpec
    instruction: np.ndarray
    context: np.ndarray
    question: np.ndarray
    prefix: np.ndarray
    answer: np.ndarray
    followups: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    @property
    def user(self) -> np.ndarray:
        return np.concatenate([self.instruction, self.context, self.question])

    def prompt_ids(self, vocab: Vocab) -> np.ndarray:
        """``<s>`` + user turn + answer prefix: what the model is given at evaluation."""
        return np.concatenate([[vocab.bos_id], self.user, self.prefix])

    def reference(self, vocab: Vocab) -> str:
        """The answer text scored by containment (the value, or the repeated words), without the full stop."""
        return vocab.decode(self.answer[:-1])

    def training_sequence(self, vocab: Vocab, context_weight: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """``(ids [L], weights [L])``: the full sequence with followups, and the loss weight of predicting each
        token from its predecessor (``weights[0] == 0``): 1 for answers and ``</s>``, `PROMPT_WEIGHT` for
        questions and prefixes, ``context_weight`` for the instruction and the context (language modelling of the
        text, whose needle template repeats and can be copied by content)."""
        eos = np.array([vocab.eos_id])
        parts = [([vocab.bos_id], 0.0), (self.instruction, context_weight), (self.context, context_weight),
                 (self.question, PROMPT_WEIGHT), (self.prefix, PROMPT_WEIGHT), (self.answer, 1.0), (eos, 1.0)]
        for asked, answer in self.followups:
            parts += [(asked, PROMPT_WEIGHT), (answer, 1.0), (eos, 1.0)]
        ids = np.concatenate([np.asarray(p, dtype=np.int64) for p, _ in parts])
        weights = np.concatenate([np.full(len(p), w, dtype=np.float32) for p, w in parts])
        weights[0] = 0.0
        return ids, weights


def sample_rng(seed: int, task: str, index: int) -> np.random.Generator:
    """The random stream of sample ``index`` of ``task`` (a `SPECS` name) under ``seed``; the registered tasks and
    the training-time evaluation draw their samples from it."""
    return np.random.default_rng([seed, list(SPECS).index(task), index])


class Generator:
    """Builds `Example`s of every `TaskSpec` from a vocabulary (template ids are encoded once)."""

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self.the, self.is_, self.dot = (int(vocab.encode(w)[0]) for w in ("The", "is", "."))

    @cached_property
    def _templates(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Each template with a ``{key}`` slot, as (ids before the slot, ids after it)."""
        out = {}
        for template in {s.question for s in SPECS.values()} | {s.prefix for s in SPECS.values()}:
            before, _, after = template.partition("{key}")
            out[template] = (self.vocab.encode(before), self.vocab.encode(after))
        return out

    @cached_property
    def _haystack_words(self) -> np.ndarray:
        return np.concatenate([self.vocab.noun_ids, self.vocab.adjective_ids, self.vocab.verb_ids])

    @cached_property
    def _needle_parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        before, _, rest = text.NEEDLE.partition("{key}")
        middle, _, after = rest.partition("{value}")
        return self.vocab.encode(before), self.vocab.encode(middle), self.vocab.encode(after)

    def _fill(self, template: str, key: int) -> np.ndarray:
        before, after = self._templates[template]
        return np.concatenate([before, [key], after]) if "{key}" in template else before

    def _needle(self, key: int, value: np.ndarray) -> np.ndarray:
        before, middle, after = self._needle_parts
        return np.concatenate([before, [key], middle, value, after])

    def example(self, spec: TaskSpec, rng: np.random.Generator, length: int, training: bool = False,
                num_needles: int | None = None) -> Example:
        """One example of ``spec`` whose length is exactly ``length`` tokens: the prompt (``<s>`` included) plus
        `MAX_NEW_TOKENS` for evaluation, or the whole training sequence (answers, ``</s>``, followups) for training.
        ``num_needles`` overrides the task's number of needles (a needle task's training curriculum).

        Raises:
            ValueError: ``length`` leaves too little room for the haystack.
        """
        vocab = self.vocab
        count = spec.num_needles if num_needles is None or not spec.num_needles else num_needles
        keys = rng.choice(vocab.key_ids, size=max(count, REPEAT_WORDS), replace=False)
        inserts: list[tuple[int, np.ndarray]] = []  # (haystack sentence slot, ids), resolved below
        needles, followups = [], []
        for key in keys[:count]:
            value = vocab.number(int(rng.integers(10**6, 10**7)))
            needles.append(self._needle(int(key), value))
            followups.append((np.concatenate([self._fill(spec.question, int(key)), self._fill(spec.prefix, int(key))]),
                              np.concatenate([value, [self.dot]])))
        if spec.num_needles:
            answer = followups[0][1]
            followups = followups[1:]
            rng.shuffle(followups)
            followups = followups[:MAX_FOLLOWUPS]
        else:  # repeat: the context's last sentence, six haystack words (the LM head predicts them often enough to
            # learn them; rare pseudo-word keys it could not copy)
            answer = np.concatenate([rng.choice(self._haystack_words, REPEAT_WORDS), [self.dot]])
        question, prefix = self._fill(spec.question, int(keys[0])), self._fill(spec.prefix, int(keys[0]))
        instruction = vocab.encode(spec.instruction)
        if not (training and spec.followups):
            followups = []
        fixed = 1 + len(instruction) + sum(map(len, needles)) + len(question) + len(prefix)
        if spec.num_needles == 0:
            fixed += len(answer)
        fixed += len(answer) + 1 + sum(len(a) + len(b) + 1 for a, b in followups) if training else MAX_NEW_TOKENS
        haystack = length - fixed
        fours = -haystack % 5  # sentences of 4 tokens; the rest have 5
        fives = (haystack - 4 * fours) // 5
        if fives < 1:
            raise ValueError(f"testbed_{spec.name}: {length} tokens leave no room for a haystack (need {fixed + 25})")
        flat = np.empty((fives, 5), dtype=np.int64)
        flat[:, 0], flat[:, 2], flat[:, 4] = self.the, self.is_, self.dot
        flat[:, 1] = rng.choice(vocab.noun_ids, fives)
        flat[:, 3] = rng.choice(vocab.adjective_ids, fives)
        for _ in range(fours):
            sentence = np.array([self.the, rng.choice(vocab.noun_ids), rng.choice(vocab.verb_ids), self.dot])
            inserts.append((int(rng.integers(0, fives + 1)), sentence))
        for index, needle in enumerate(needles):
            low = max(0, fives - RECENT_SENTENCES) if spec.recent and index == 0 else 0
            inserts.append((int(rng.integers(low, fives + 1)), needle))
        if spec.num_needles == 0:
            inserts.append((fives, answer))  # last in the list: the context's last sentence
        context = _insert(flat.reshape(-1), 5, inserts)
        return Example(spec, instruction, context, question, prefix, answer, followups)


def _insert(stream: np.ndarray, unit: int, inserts: list[tuple[int, np.ndarray]]) -> np.ndarray:
    """``stream`` with each ``(slot, ids)`` inserted before unit ``slot`` (in list order within a slot)."""
    order = sorted(range(len(inserts)), key=lambda i: (inserts[i][0], i))
    pieces, start = [], 0
    for i in order:
        slot, ids = inserts[i]
        pieces += [stream[start : slot * unit], ids]
        start = slot * unit
    pieces.append(stream[start:])
    return np.concatenate(pieces)
