"""RULER (NVIDIA/RULER @ c3f5e3b), 13 tasks generated locally and deterministically from a seed.

Configurations come from the official `synthetic.yaml` (shipped in `data/ruler/`); templates, answer prefixes and
budgets from `scripts/data/synthetic/constants.py`; generators follow `scripts/data/synthetic/*.py`; the scorer
follows `scripts/eval/synthetic/constants.py`. Where elastic-bench differs:
- the chat template is the tokenizer's own, applied by `render` with the answer prefix starting the assistant turn
  (RULER pastes a hard-coded wrapper); few-shot examples (vt, cwe) use the plain "base" wrapper inside the user turn;
- each sample draws from its own generator seeded by ``(seed, index)`` (RULER shares one global generator, so its
  samples depend on the search path), which makes every sample reproducible on its own;
- length fitting measures the exact model input (chat template and answer prefix included): the largest haystack
  with ``len(input_ids) + max_new_tokens <= length`` by binary search, then per sample a binary search below that
  size when a sample does not fit (RULER steps down by a fixed increment).
"""

from __future__ import annotations

import math
import random
import re
import string
import uuid
from collections.abc import Callable, Sequence
from functools import lru_cache
from importlib import resources

import numpy as np
import yaml

from . import ruler_data
from .base import LengthTooShortError, Sample, Task, register, render
from .corpora import Source

TEMPLATES = {
    "niah": (
        "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will "
        "quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} "
        "for {query} mentioned in the provided text?",
        " The special magic {type_needle_v} for {query} mentioned in the provided text are",
        128,
    ),
    "variable_tracking": (
        "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
        "Question: Find all variables that are assigned the value {query} in the text above.",
        " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are assigned "
        "the value {query}, they are: ",
        30,
    ),
    "common_words_extraction": (
        "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
        "that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
        " Answer: The top 10 words that appear most often in the list are:",
        120,
    ),
    "freq_words_extraction": (
        "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
        "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
        "What are the three most frequently appeared words in the above coded text?",
        " Answer: According to the coded text above, the three most frequently appeared words are:",
        50,
    ),
    "qa": (
        "Answer the question based on the given documents. Only give me the answer and do not output any other "
        "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
        "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}",
        " Answer:",
        32,
    ),
}
"""generator → (task template, answer prefix, max new tokens)."""

NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
DEPTHS = np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int).tolist()
DOCUMENT = "Document {i}:\n{document}"
SAMPLES = 500


def score(metric: str, prediction: str, references: list[str]) -> float:
    """RULER's per-sample score in [0, 1] after its post-processing (strip, control characters → "\\n", strip).

    ``metric="all"`` (string_match_all): fraction of references contained in the prediction, case-insensitive.
    ``metric="part"`` (string_match_part): 1 if any reference is contained, else 0.
    """
    pred = re.sub(r"[\x00-\x1f]", "\n", prediction.strip()).strip().lower()
    hits = [1.0 if ref.lower() in pred else 0.0 for ref in references]
    if metric == "all":
        return sum(hits) / len(hits)
    if metric == "part":
        return max(hits)
    raise ValueError(f"unknown RULER metric {metric!r}; use 'all' or 'part'")


def join_keys(keys: list[str]) -> str:
    """``"k1, k2, and k3"`` (RULER's multi-query phrasing)."""
    return ", ".join(keys[:-1]) + ", and " + keys[-1] if len(keys) > 1 else keys[0]


class Ruler(Task):
    """A RULER task: a generator with the arguments of one `synthetic.yaml` entry.

    Subclasses implement `build` (the user text, answer prefix and answers for a haystack size and a sample) and
    may override `prepare` (per-run resources), `min_units` and `sources_for`.
    """

    generator: str = ""
    args: dict = {}
    metric = "all"
    samples_default = SAMPLES  # samples per task and length without a limit
    category: str | None = None  # the samples' ``metadata.category`` where set (RULER's tasks read their family)
    step_below_4k = 5  # RULER's `incremental` for sentence haystacks below 4K, 25 above (used for the first guess)
    step = 25

    @property
    def max_new_tokens(self) -> int:
        return TEMPLATES[self.generator][2]

    @classmethod
    def sources_for(cls, args: dict) -> tuple[Source, ...]:
        """The corpus files the generator reads with the arguments ``args`` (`Task.sources`); none by default."""
        return ()

    @classmethod
    def identities_for(cls, args: dict) -> frozenset[str]:
        """What the generator's questions and answers come from with the arguments ``args`` (`Task.identities`):
        ``generator:ruler.<generator>`` (the essay haystack of some niah configurations only pads)."""
        return frozenset({f"generator:ruler.{cls.generator}"})

    def prepare(self, tokenizer, length: int, seed: int) -> None:
        """Load what every sample of a (tokenizer, length, seed) needs; `samples` calls it before `build`."""

    def min_units(self, index: int) -> int:
        """The smallest haystack size of sample ``index`` (in the generator's unit: noise lines, essay words,
        distinct words, documents, ...)."""
        return 1

    def build(self, units: int, index: int, seed: int, length: int) -> tuple[str, str, list[str]]:
        """Sample ``index`` with a haystack of ``units``: ``(user text, answer prefix, answers)``, a pure function of
        its arguments once `prepare` has run for the same tokenizer, length and seed."""
        raise NotImplementedError

    @staticmethod
    def _rng(seed: int, index: int) -> random.Random:
        return random.Random(f"ruler:{seed}:{index}")

    def num_samples(self, limit: int | None) -> int:
        return self.samples_default if limit is None else limit

    def samples(self, tokenizer, length: int, limit: int | None = None, seed: int = 42) -> list[Sample]:
        """Samples whose input plus ``max_new_tokens`` fits ``length``: the haystack size is the largest that fits
        for sample 0 (binary search), lowered per sample by binary search only when that sample does not fit."""
        self.prepare(tokenizer, length, seed)
        budget = length - self.max_new_tokens

        def encode(units: int, index: int) -> tuple[list[int], list[str]]:
            user, prefix, answers = self.build(units, index, seed, length)
            return render(tokenizer, user, prefix), answers

        def fits(units: int, index: int) -> bool:
            return len(encode(units, index)[0]) <= budget

        def largest(index: int, hi: int | None) -> int:
            """The largest fitting size ≥ the smallest (which must fit), below hi (which does not) or found by
            doubling."""
            lo = self.min_units(index)
            if not fits(lo, index):
                need = len(encode(lo, index)[0]) + self.max_new_tokens
                raise LengthTooShortError(
                    f"{self.name}: a target length of {length} tokens is too short: the smallest input (haystack size "
                    f"{lo}) needs {need} tokens with this tokenizer, answer budget included"
                )
            start = self.step_below_4k if length < 4096 else self.step
            return largest_fitting(lambda units: fits(units, index), lo, hi, start)

        first = largest(0, None)
        result = []
        for index in range(self.num_samples(limit)):
            units = first if fits(first, index) else largest(index, first)
            ids, answers = encode(units, index)
            metadata = {"length": length, "units": units, **({"category": self.category} if self.category else {})}
            result.append(Sample(f"{index}", ids, self.max_new_tokens, answers, metadata))
        return result

    def score(self, prediction: str, sample: Sample) -> float:
        return score(self.metric, prediction, sample.references)

    def aggregate(self, records: list[dict]) -> dict[str, float]:
        """``round(mean × 100, 2)``, computed as RULER does (sum / n × 100)."""
        scores = [r["score"] for r in records]
        return {"score": round(sum(scores) / len(scores) * 100, 2) if scores else float("nan")}


def largest_fitting(fits: Callable[[int], bool], lo: int, hi: int | None = None, start: int = 2) -> int:
    """The largest size ``n >= lo`` with ``fits(n)``, for a ``fits`` that holds up to some size and fails above it.

    ``fits(lo)`` is taken to hold. With ``hi`` (a size known not to fit) the search bisects ``[lo, hi)``; without it,
    the size doubles from ``max(lo + 1, start)`` until one does not fit, then the search bisects.
    """
    if hi is None:
        hi = max(lo + 1, start)
        while fits(hi):
            lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def random_value(kind: str, rng: random.Random, digits: int = 7) -> str:
    """A needle key or value: a number of ``digits`` digits, a UUID4, or an ``adjective-noun`` word pair."""
    if kind == "numbers":
        return str(rng.randint(10 ** (digits - 1), 10**digits - 1))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    if kind == "words":
        return rng.choice(ruler_data.needle_words())
    raise ValueError(f"unknown RULER needle type {kind!r}")


class Niah(Ruler):
    """Needle in a haystack (`niah.py`): noise, essay or distractor-needle haystacks."""

    generator = "niah"

    @property
    def num_keys(self) -> int:
        return max(self.args["num_needle_k"], self.args["num_needle_q"])

    @classmethod
    def sources_for(cls, args):
        return (ruler_data.source("essay"), ruler_data.PUNKT) if args["type_haystack"] == "essay" else ()

    def prepare(self, tokenizer, length, seed):
        if self.args["type_haystack"] == "essay":
            essay, split = ruler_data.essay_words(self.data_dir), ruler_data.sentence_splitter(self.data_dir)

            @lru_cache(maxsize=64)  # the essay text depends on the size only: split it once per size
            def sentences(units: int) -> tuple[str, ...]:
                words = essay if units <= len(essay) else essay * -(-units // len(essay))
                return tuple(split(" ".join(words[:units]).strip()))

            self._sentences = sentences

    def essay_sentences(self, units: int) -> Sequence[str]:
        """The essay haystack of size ``units``: the sentences of the essays' first ``units`` words (the essays
        repeated when shorter), split by punkt. A subclass may draw the haystack from another text (`prepare` then
        need not load the essays)."""
        return self._sentences(units)

    def min_units(self, index):
        return 1 if self.args["type_haystack"] == "essay" else self.num_keys * self.args["num_needle_v"]

    def _haystack(self, units: int, needles: list[str], rng: random.Random) -> str:
        a = self.args
        if a["type_haystack"] == "essay":
            sentences = self.essay_sentences(units)
            cuts = sorted(int(len(sentences) * (d / 100)) for d in rng.sample(DEPTHS, len(needles)))
            bounds = [0, *cuts, len(sentences)]
            parts = []
            for i in range(1, len(bounds)):
                parts.append(" ".join(sentences[bounds[i - 1] : bounds[i]]))
                if i - 1 < len(needles):
                    parts.append(needles[i - 1])
            return " ".join(parts)
        lines = [NOISE] * units if a["type_haystack"] == "noise" else self.distractor_needles(units, rng)
        for position, needle in zip(sorted(rng.sample(range(units), len(needles)), reverse=True), needles):
            lines.insert(position, needle)
        return "\n".join(lines)

    def value(self, rng: random.Random) -> str:
        """A needle value (``num_digits_v`` digits for numbers: 7 unless the arguments say otherwise)."""
        return random_value(self.args["type_needle_v"], rng, self.args.get("num_digits_v", 7))

    def distractor_needles(self, units: int, rng: random.Random) -> list[str]:
        """The ``needle`` haystack: ``units`` needles of random keys and values."""
        v = self.args["type_needle_v"]
        return [NEEDLE.format(type_needle_v=v, key=random_value(self.args["type_needle_k"], rng), value=self.value(rng))
                for _ in range(units)]

    def prompt(self, context: str, query: str, type_v: str, single: bool) -> tuple[str, str]:
        """``(user text, answer prefix)``: RULER's niah template, in the singular for a single answer."""
        template, prefix, _ = TEMPLATES["niah"]
        if single:
            for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
                template, prefix = template.replace(old, new), prefix.replace(old, new)
        return (template.format(type_needle_v=type_v, context=context, query=query),
                prefix.format(type_needle_v=type_v, query=query))

    def build(self, units, index, seed, length):
        a, rng = self.args, self._rng(seed, index)
        keys, values, needles = [], [], []
        for _ in range(self.num_keys):
            keys.append(random_value(a["type_needle_k"], rng))
            values.append([self.value(rng) for _ in range(a["num_needle_v"])])
            needles += [NEEDLE.format(type_needle_v=a["type_needle_v"], key=keys[-1], value=v) for v in values[-1]]
        random.Random(seed).shuffle(needles)
        context = self._haystack(units, needles, rng)
        chosen = rng.sample(range(self.num_keys), a["num_needle_q"])
        single = a["num_needle_q"] * a["num_needle_v"] == 1
        type_v = a["type_needle_v"][:-1] if single else a["type_needle_v"]
        user, prefix = self.prompt(context, join_keys([keys[i] for i in chosen]), type_v, single)
        return user, prefix, [v for i in chosen for v in values[i]]


class VariableTracking(Ruler):
    """Variable tracking (`variable_tracking.py`): chains ``VAR X = 12345``, ``VAR Y = VAR X`` hidden in noise, after
    a one-shot example fitted to 500 tokens and re-randomised per sample."""

    generator = "variable_tracking"
    step = 10
    icl_tokens = 500

    @property
    def hops(self) -> int:
        return self.args["num_hops"]

    def min_units(self, index):
        return self.hops + 1

    def _chains(self, rng: random.Random, icl: bool) -> tuple[list[list[str]], list[list[str]]]:
        chains_n, hops = self.args["num_chains"], min(10, self.hops) if icl else self.hops
        k = 3 if icl else 5
        names = ["".join(rng.choices(string.ascii_uppercase, k=k)) for _ in range((hops + 1) * chains_n)]
        while len(set(names)) < chains_n * (hops + 1):
            names.append("".join(rng.choices(string.ascii_uppercase, k=k)))
        variables, chains = [], []
        for i in range(0, len(names), hops + 1):
            group = names[i : i + hops + 1]
            variables.append(group)
            chain = [f"VAR {group[0]} = {12345 if icl else rng.randint(10000, 99998)}"]
            chain += [f"VAR {group[j + 1]} = VAR {group[j]} " for j in range(hops)]
            chains.append(chain)
        return variables, chains

    def _text(self, units: int, rng: random.Random, icl: bool) -> tuple[str, str, list[str]]:
        variables, chains = self._chains(rng, icl)
        value = chains[0][0].split("=")[-1].strip()
        lines = [NOISE] * units
        for chain in chains:
            for j, position in enumerate(sorted(rng.sample(range(len(lines)), len(chain)))):
                lines.insert(position + j, chain[j])
        context = "\n".join(lines).replace(". \n", ".\n")
        template, prefix, _ = TEMPLATES["variable_tracking"]
        prefix = prefix.format(num_v=self.hops + 1, query=value)
        return template.format(context=context, query=value), prefix, variables[0]

    def prepare(self, tokenizer, length, seed):
        """The one-shot example: the largest noise size whose "template + prefix" text has at most 500 tokens (no
        special tokens), followed by " " + its answers + "\\n"."""

        def example(units: int) -> tuple[str, list[str]]:
            user, prefix, answers = self._text(units, random.Random(f"ruler-icl:{seed}"), icl=True)
            return user + prefix, answers

        def size(units: int) -> int:
            return len(tokenizer(example(units)[0], add_special_tokens=False).input_ids)

        text, answers = example(largest_fitting(lambda units: size(units) <= self.icl_tokens, 5, None, 10))
        self._icl = text + " " + " ".join(answers) + "\n"

    def _randomized_icl(self, rng: random.Random) -> str:
        icl = self._icl
        for name in icl.strip().split()[-self.hops - 1 :]:
            icl = icl.replace(name, "".join(rng.choices(string.ascii_uppercase, k=len(name))))
        return icl.replace("12345", str(rng.randint(10000, 99998)))

    def build(self, units, index, seed, length):
        rng = self._rng(seed, index)
        icl = self._randomized_icl(rng)
        user, prefix, answers = self._text(units, rng, icl=False)
        return icl + "\n" + user, prefix, answers


class CommonWords(Ruler):
    """Common words extraction (`common_words_extraction.py`): 10 words repeated 30× among words repeated 3×
    (6× and 1× below 4K), numbered, after one example."""

    generator = "common_words_extraction"
    step = step_below_4k = 10

    @classmethod
    def sources_for(cls, args):
        return (ruler_data.source("english_words"),)

    def prepare(self, tokenizer, length, seed):
        words = list(ruler_data.common_words())
        random.Random(seed).shuffle(words)
        self._words = words

    def min_units(self, index):
        return self.args["num_cw"]

    def _example(self, n: int, common_repeats: int, uncommon_repeats: int, rng, seed) -> tuple[str, list[str]]:
        pool = self._words if n <= len(self._words) else ruler_data.english_words(self.data_dir)
        chosen = rng.sample(pool, n)
        common, uncommon = chosen[: self.args["num_cw"]], chosen[self.args["num_cw"] :]
        listed = common * common_repeats + uncommon * uncommon_repeats
        random.Random(seed).shuffle(listed)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed)), common

    def build(self, units, index, seed, length):
        rng = self._rng(seed, index)
        template, prefix, _ = TEMPLATES["common_words_extraction"]
        if length < 4096:
            shot, shot_answers = self._example(20, 3, 1, rng, seed)
            context, answers = self._example(units, 6, 1, rng, seed)
        else:
            shot, shot_answers = self._example(40, 10, 3, rng, seed)
            context, answers = self._example(units, self.args["freq_cw"], self.args["freq_ucw"], rng, seed)
        numbered = " ".join(f"{i + 1}. {w}" for i, w in enumerate(shot_answers))
        example = template.format(context=shot) + prefix + " " + numbered
        return example + "\n" + template.format(context=context), prefix, answers


class FrequentWords(Ruler):
    """Frequent words extraction (`freq_words_extraction.py`): random 6-letter words with Zipf(α) counts; the
    top-ranked word is replaced by "..." noise, the answers are ranks 2–4."""

    generator = "freq_words_extraction"
    coded_length = 6

    @property
    def alpha(self) -> float:
        return float(self.args["alpha"])

    def build(self, units, index, seed, length):
        rng = self._rng(seed, index)
        vocab_size = (length - self.max_new_tokens) // 50
        if vocab_size < 4:  # the "..." noise word and the three answers
            raise LengthTooShortError(f"{self.name}: a target length of {length} tokens is too short: its vocabulary "
                                      f"holds (length − {self.max_new_tokens}) / 50 words and needs 4, so it needs at "
                                      f"least {self.max_new_tokens + 200} tokens")
        vocab = ["".join(rng.choices(string.ascii_lowercase, k=self.coded_length)) for _ in range(vocab_size)]
        while len(set(vocab)) < vocab_size:
            vocab.append("".join(rng.choices(string.ascii_lowercase, k=self.coded_length)))
        vocab = sorted(set(vocab))
        random.Random(seed).shuffle(vocab)
        vocab[0] = "..."
        ranks = np.arange(1, len(vocab) + 1)
        counts = (units * (ranks**-self.alpha) / zeta(self.alpha)).astype(int)
        words = [w for w, c in zip(vocab, counts.tolist()) for _ in range(c)]
        random.Random(seed).shuffle(words)
        template, prefix, _ = TEMPLATES["freq_words_extraction"]
        return template.format(context=" ".join(words)), prefix, vocab[1:4]


def zeta(s: float) -> float:
    """Riemann ζ(s) for the α of `synthetic.yaml` (2.0: π²/6), as ``scipy.special.zeta`` gives it."""
    if s != 2.0:
        raise ValueError(f"RULER fwe: only alpha = 2.0 (the official setting) is supported, got {s}")
    return math.pi**2 / 6


class QA(Ruler):
    """Question answering (`qa.py`) over SQuAD v2.0 dev (qa_1) or HotpotQA dev distractor (qa_2): the gold documents
    plus distractors, shuffled; the first 500 questions in file order."""

    generator = "qa"
    metric = "part"
    step = step_below_4k = 10

    @classmethod
    def sources_for(cls, args):
        return (ruler_data.source(args["dataset"]),)

    @classmethod
    def identities_for(cls, args):
        """The generator and the dataset its questions and documents come from (``dataset:squad``,
        ``dataset:hotpotqa``)."""
        return super().identities_for(args) | {f"dataset:{args['dataset']}"}

    def prepare(self, tokenizer, length, seed):
        self._questions, self._docs = ruler_data.qa_dataset(self.args["dataset"], self.data_dir)

    def num_samples(self, limit):
        total = min(SAMPLES, len(ruler_data.qa_dataset(self.args["dataset"], self.data_dir)[0]))
        return total if limit is None else min(limit, total)

    def min_units(self, index):
        return len(self._questions[index]["context"])

    def build(self, units, index, seed, length):
        rng = self._rng(seed, index)
        question, docs = self._questions[index], self._docs
        gold, more = question["context"], question.get("more_context", [])
        if units < len(docs):
            if units - len(gold) > len(more):
                taken = set(gold + more)
                others = [i for i in range(len(docs)) if i not in taken]
                chosen = gold + more + rng.sample(others, max(0, units - len(gold) - len(more)))
            else:
                chosen = gold + rng.sample(more, units - len(gold))
            texts = [docs[i] for i in chosen]
        else:
            texts = (docs * -(-units // len(docs)))[:units]
        random.Random(seed).shuffle(texts)
        context = "\n\n".join(DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(texts))
        template, prefix, _ = TEMPLATES["qa"]
        return template.format(context=context, query=question["query"]), prefix, question["outputs"]


GENERATORS: dict[str, type[Ruler]] = {
    "niah": Niah,
    "variable_tracking": VariableTracking,
    "common_words_extraction": CommonWords,
    "freq_words_extraction": FrequentWords,
    "qa": QA,
}


@lru_cache(maxsize=1)
def official_configs() -> dict[str, dict]:
    """The 13 task configurations of RULER's `synthetic.yaml`: ``{name: {"task": generator, "args": {...}}}``."""
    return yaml.safe_load((resources.files(__package__) / "data" / "ruler" / "synthetic.yaml").read_text())


def _register_all() -> None:
    for name, config in official_configs().items():
        base = GENERATORS[config["task"]]
        attrs = {"args": config["args"], "sources": base.sources_for(config["args"]),
                 "identities": base.identities_for(config["args"]), "__doc__": f"RULER {name}: {base.__doc__}"}
        cls = type(f"Ruler_{name}", (base,), attrs)
        register(f"ruler_{name}", group="ruler")(cls)


_register_all()
