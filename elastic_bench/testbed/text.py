"""Every word the testbed uses: task templates, haystack words, pseudo-word keys.

The vocabulary (`elastic_bench.testbed.vocab`) is built from this page alone, offline and deterministically.
Templates follow RULER's niah wording (NVIDIA/RULER ``scripts/data/synthetic/constants.py``) without its colons, so
that a word-level tokenizer decodes them back to the same text.
"""

from __future__ import annotations

import random
from functools import lru_cache

# ---- templates: {key} is a pseudo-word key, {value} a 7-digit number ------------------------------------------------

NEEDLE = "One of the special magic numbers for {key} is {value}."

NIAH_INSTRUCTION_SINGLE = (
    "A special magic number is hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the number afterwards."
)
NIAH_INSTRUCTION_MULTI = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize them. "
    "I will quiz you about the numbers afterwards."
)
NIAH_QUESTION = "What is the special magic number for {key} mentioned in the provided text?"
NIAH_PREFIX = "The special magic number for {key} mentioned in the provided text is"

RECENT_INSTRUCTION = (
    "A special magic number is hidden near the end of the following text. Read the last lines carefully. "
    "I will quiz you about the number afterwards."
)
RECENT_QUESTION = "What is the special magic number for {key} mentioned at the end of the text?"
RECENT_PREFIX = "The special magic number for {key} mentioned at the end of the text is"

REPEAT_INSTRUCTION = (
    "Read the following text carefully. I will ask you to repeat its last sentence afterwards."
)
REPEAT_QUESTION = "Repeat the last sentence of the text."
REPEAT_PREFIX = "The last sentence of the text is"

TEMPLATES = (
    NEEDLE, NIAH_INSTRUCTION_SINGLE, NIAH_INSTRUCTION_MULTI, NIAH_QUESTION, NIAH_PREFIX, RECENT_INSTRUCTION,
    RECENT_QUESTION, RECENT_PREFIX, REPEAT_INSTRUCTION, REPEAT_QUESTION, REPEAT_PREFIX,
)

# ---- haystack: "The {noun} is {adjective}." (5 tokens) and "The {noun} {verb}." (4 tokens) ---------------------------

NOUNS = (
    "grass sky sun moon star river lake sea ocean hill mountain valley forest tree leaf flower garden field road "
    "bridge city town village house door window roof wall floor table chair bed lamp clock book letter paper pen "
    "cup plate bowl spoon knife bread cheese apple pear plum grape lemon orange cherry melon berry carrot onion "
    "potato bean rice soup tea coffee milk water wine stone rock sand dust snow rain wind storm cloud fog ice fire "
    "smoke light shadow dog cat horse cow sheep goat bird fish frog bee ant fox wolf bear deer mouse owl duck "
    "train ship boat car bus bell drum song ball kite coat hat shoe ring box key rope wheel"
).split()
ADJECTIVES = (
    "green blue yellow red white black brown grey pink purple golden silver warm cold hot cool wet dry bright dark "
    "quiet loud soft hard smooth rough heavy light tall short long wide narrow deep shallow old young new fresh "
    "clean dirty busy calm happy sad brave shy proud kind gentle wild tame sweet sour bitter salty round flat sharp "
    "small large tiny huge empty full rich poor slow fast early late near far open closed strong weak thin thick "
    "plain fancy simple strange famous hidden"
).split()
VERBS = (
    "sleeps runs jumps sings waits rests shines glows falls rises grows moves stays swims flies walks turns spins "
    "rolls shakes sways hums smiles listens watches dreams breathes drifts floats melts burns fades returns "
    "wanders stops starts"
).split()


def sentence(rng) -> str:
    """One haystack sentence as text, "The {noun} is {adjective}." or "The {noun} {verb}." (even odds), drawn from
    ``rng`` (a `numpy.random.Generator`): the testbed's noise, in words that every English tokenizer spells."""
    noun = NOUNS[rng.integers(len(NOUNS))]
    if rng.random() < 0.5:
        return f"The {noun} is {ADJECTIVES[rng.integers(len(ADJECTIVES))]}."
    return f"The {noun} {VERBS[rng.integers(len(VERBS))]}."


# ---- pseudo-word keys of 2-3 syllables ----------------------------------------------------------------------------

CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"
NUM_KEYS = 4000
KEY_SEED = 20240601


@lru_cache(maxsize=1)
def keys() -> tuple[str, ...]:
    """``NUM_KEYS`` distinct consonant-vowel pseudo-words (half of 2, half of 3 syllables), sorted; none is a word
    of the templates or the haystack."""
    taken = set(template_words()) | set(NOUNS) | set(ADJECTIVES) | set(VERBS)
    syllables = [c + v for c in CONSONANTS for v in VOWELS]
    rng = random.Random(KEY_SEED)
    found: set[str] = set()
    for count in (2, 3):
        target = len(found) + NUM_KEYS // 2
        while len(found) < target:
            word = "".join(rng.choice(syllables) for _ in range(count))
            if word not in taken:
                found.add(word)
    return tuple(sorted(found))


def template_words() -> list[str]:
    """The words and punctuation of every template, placeholders removed, in first-seen order."""
    seen: dict[str, None] = {}
    for template in TEMPLATES:
        text = template.replace("{key}", " ").replace("{value}", " ")
        for piece in text.replace(".", " . ").replace("?", " ? ").replace(",", " , ").split():
            seen.setdefault(piece)
    return list(seen)
