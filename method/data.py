"""Router training data: records (`elastic_bench.training.records`: the plain and the official formats) → examples with
a
target per category (tokenised and packed by `elastic_bench.training.engine`); and a synthetic generator for quick runs.

Design decisions:
- Every category must have a target: unknown categories are rejected, never mapped to a default.
- Tokenisation (chat template, middle truncation), packing and the LM-loss targets are generic and live in
  `elastic_bench.training.engine` (`tokenize`, `pack`).
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Iterable
from pathlib import Path

from elastic_bench.training.records import CODE_PREFIX, SUMMARY_PREFIX, Example, read_records, to_example

__all__ = ["CODE_PREFIX", "DEFAULT_TARGETS", "SUMMARY_PREFIX", "Example", "check_categories", "check_targets",
           "load_examples", "read_records", "synthetic_records", "to_example"]

# Paper §4.1: the five task labels of the training mixture and their target ΩMSR (t_sen = 0.7, t_rob = 1.0), plus
# the two generic category names of the synthetic generator and the testbed.
DEFAULT_TARGETS: dict[str, float] = {
    "Single QA": 0.7,
    "MultiHop QA": 0.7,
    "Summarization": 1.0,
    "Code": 1.0,
    "In-Context Learning": 1.0,
    "sensitive": 0.7,
    "robust": 1.0,
}
def load_examples(path: str | Path, targets: dict[str, float]) -> list[Example]:
    """Examples of the records at ``path``; every category must be a key of ``targets``."""
    examples = [to_example(r, f"{path} record {i + 1}") for i, r in enumerate(read_records(path))]
    check_categories(examples, targets)
    return examples


def check_categories(examples: Iterable[Example], targets: dict[str, float]) -> list[str]:
    """The categories present (in ``targets`` order); raises for a category without a target (`check_targets`)."""
    present = {e.category for e in examples}
    check_targets(present, targets)
    return [c for c in targets if c in present]


def check_targets(present: set[str], targets: dict[str, float]) -> None:
    """Refuse training data of the categories ``present`` when one has no target ΩMSR in ``targets``, naming the
    target that looks like a misspelling of it (``--target sensitiv=0.9`` for ``sensitive``).

    Raises:
        ValueError: no category, or one without a target (one line).
    """
    if not present:
        raise ValueError("no training examples")
    unknown = sorted(present - set(targets))
    if not unknown:
        return
    spare = [t for t in targets if t not in present]  # targets of no category of the data
    close = {c: difflib.get_close_matches(c, spare, n=1, cutoff=0.6) for c in unknown}
    hints = [f"--target {match[0]}={targets[match[0]]:g} names no category of the data: did you mean "
             f"--target {c}={targets[match[0]]:g}?" for c, match in close.items() if match]
    raise ValueError(f"categories {unknown} have no target ΩMSR; known: {sorted(targets)} (add --target NAME=VALUE)"
                     + "".join(f"; {hint}" for hint in hints))


# ---- synthetic generator -------------------------------------------------------------------------------------------

_WORDS = (
    "river stone cloud amber forest lantern harbor meadow copper signal violet orbit canyon ember willow quartz "
    "saddle thistle marble falcon garden beacon pepper timber ripple summit velvet walnut"
).split()


def synthetic_records(num: int, length: int = 400, seed: int = 0) -> list[dict[str, str]]:
    """Plain records of two categories for quick runs and tests, about ``length`` characters of prompt each.

    - ``"sensitive"``: key–value retrieval; code lines are spread over the first half of a noise haystack and the
      question at the end asks for the code of one key (long-range attention matters).
    - ``"robust"``: continue a story written in capitals; the answer repeats the last sentence (local attention
      suffices).

    The two categories differ in their instructions and their alphabet, so even a tiny random model's pooled keys
    tell them apart.
    """
    rng = random.Random(seed)
    records = []
    for i in range(num):
        sentences, size = [], 0
        while size < length:
            sentence = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 8))) + "."
            sentences.append(sentence)
            size += len(sentence) + 1
        if i % 2 == 0:
            keys = rng.sample(_WORDS, 3)
            codes = [str(rng.randint(1000, 9999)) for _ in keys]
            for key, code in zip(keys, codes):
                sentences.insert(rng.randrange(len(sentences) // 2 + 1), f"The code of {key} is {code}.")
            k = rng.randrange(len(keys))
            prompt = "Find the code. " + " ".join(sentences) + f" Question: what is the code of {keys[k]}?"
            records.append({"prompt": prompt, "answer": codes[k], "category": "sensitive"})
        else:
            sentences = [s.upper() for s in sentences]
            prompt = "CONTINUE THE STORY. " + " ".join(sentences) + " REPEAT THE LAST SENTENCE."
            records.append({"prompt": prompt, "answer": sentences[-1], "category": "robust"})
    return records
