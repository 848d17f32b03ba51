"""RULER (NVIDIA/RULER @ c3f5e3b), generated locally and deterministically from a seed.

Templates, answer prefixes, budgets and the scorer follow `scripts/data/synthetic/constants.py`,
`scripts/data/synthetic/niah.py` and `scripts/eval/synthetic/constants.py` (see `reference/benchmarks.md` §1).
Length fitting: the largest haystack whose prompt (chat wrapper and answer prefix included, special tokens of the
template included, no extra BOS) plus the generation budget fits the target length, by binary search.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from .base import Sample, Task, register, render

NIAH_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz "
    "you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} "
    "mentioned in the provided text?"
)
NIAH_ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def score(metric: str, prediction: str, references: list[str]) -> float:
    """RULER's per-sample score in [0, 1] after its post-processing.

    ``metric="all"`` (string_match_all): fraction of references contained in the prediction, case-insensitive.
    ``metric="part"`` (string_match_part): 1 if any reference is contained, else 0.
    """
    pred = re.sub(r"[\x00-\x1f]", "\n", prediction.strip()).strip().lower()
    hits = [ref.lower() in pred for ref in references]
    if metric == "all":
        return sum(hits) / len(hits)
    if metric == "part":
        return float(any(hits))
    raise ValueError(f"unknown RULER metric {metric!r}; use 'all' or 'part'")


@lru_cache(maxsize=1)
def needle_words() -> list[str]:
    """``adjective-noun`` keys from wonderwords' word lists, sorted and de-duplicated (as RULER)."""
    assets = resources.files("wonderwords") / "assets"
    adjectives = (assets / "adjectivelist.txt").read_text().split()
    nouns = (assets / "nounlist.txt").read_text().split()
    return sorted({f"{a}-{n}" for a in adjectives for n in nouns})


@dataclass
class NiahConfig:
    """One needle-in-a-haystack configuration of `synthetic.yaml`."""

    haystack: str = "noise"
    key_type: str = "words"
    value_type: str = "numbers"
    num_keys: int = 1
    num_values: int = 1
    num_queries: int = 1
    max_new_tokens: int = 128


class Niah(Task):
    """RULER's niah generator. This foundation version supports the noise haystack with word keys and number
    values (niah_single_1)."""

    config = NiahConfig()

    def _needle(self, rng: random.Random) -> tuple[str, str]:
        key = rng.choice(needle_words())
        value = str(rng.randint(10**6, 10**7 - 1))
        return key, value

    def _text(self, n_haystack: int, rng: random.Random) -> tuple[str, str, list[str]]:
        cfg = self.config
        keys, values, needles = [], [], []
        for _ in range(cfg.num_keys):
            key, _ = self._needle(rng)
            keys.append(key)
            for _ in range(cfg.num_values):
                value = self._needle(rng)[1]
                values.append(value)
                needles.append(NEEDLE.format(type_needle_v=cfg.value_type, key=key, value=value))
        rng.shuffle(needles)
        sentences = [NOISE] * n_haystack
        for index, needle in zip(sorted(rng.sample(range(n_haystack), len(needles)), reverse=True), needles):
            sentences.insert(index, needle)
        query_keys = keys[: cfg.num_queries]
        answers = [v for k, v in zip([k for k in keys for _ in range(cfg.num_values)], values) if k in query_keys]
        query = query_keys[0] if len(query_keys) == 1 else ", ".join(query_keys[:-1]) + ", and " + query_keys[-1]
        return "\n".join(sentences), query, answers

    def _prompt(self, tokenizer, n_haystack: int, seed: int) -> tuple[list[int], list[str]]:
        cfg = self.config
        rng = random.Random(seed)
        context, query, answers = self._text(n_haystack, rng)
        template, prefix, type_v = NIAH_TEMPLATE, NIAH_ANSWER_PREFIX, cfg.value_type
        if cfg.num_queries * cfg.num_values == 1:
            for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
                template, prefix = template.replace(old, new), prefix.replace(old, new)
            type_v = type_v[:-1]
        user = template.format(type_needle_v=type_v, context=context, query=query)
        return render(tokenizer, user, prefix.format(type_needle_v=type_v, query=query)), answers

    def samples(self, tokenizer, length: int, limit: int | None = None, seed: int = 42) -> list[Sample]:
        budget = length - self.config.max_new_tokens

        def fits(n: int, sample_seed: int) -> bool:
            return len(self._prompt(tokenizer, n, sample_seed)[0]) <= budget

        if not fits(1, seed):
            raise ValueError(f"{self.name}: target length {length} is too short for the template")
        lo, hi = 1, 2
        while fits(hi, seed):
            lo, hi = hi, hi * 2
        while hi - lo > 1:  # largest n that fits, for the first sample's needles
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid, seed) else (lo, mid)
        step = 25 if length >= 4096 else 5  # RULER's `incremental` for sentence haystacks
        result = []
        for index in range(limit if limit is not None else 500):
            n = lo
            while n > 1 and not fits(n, seed + index):
                n = max(1, n - step)
            ids, answers = self._prompt(tokenizer, n, seed + index)
            result.append(
                Sample(f"{index}", ids, self.config.max_new_tokens, answers, {"length": length, "haystack_units": n})
            )
        return result

    def score(self, prediction: str, sample: Sample) -> float:
        return score("all", prediction, sample.references)


@register("ruler_niah_single_1", group="ruler")
class NiahSingle1(Niah):
    """Single needle, noise haystack, word key, number value."""

    config = NiahConfig()
