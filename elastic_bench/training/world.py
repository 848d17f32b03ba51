"""A made-up world for router training records: people and towns with invented names, facts about them, and short
local news reports, all drawn from a `numpy.random.Generator` (a pure function of its seed).

Nothing here comes from a dataset or from a benchmark's generator: the names are syllables put together, the facts and
reports follow the templates below, which no registered task uses (RULER's needles are "special magic numbers", the
testbed's too). Every tokenizer spells the words.

- A person: a given name and a family name of invented syllables ("Velora Tasmik"); a town: syllables and an English
  place-name ending ("Dorvale").
- A fact: one attribute of a person in a sentence (`ATTRIBUTES`: home town, trade, birth year, instrument), which a
  question asks back; a relation links two people (`RELATIONS`: who taught whom, who lives with whom).
- A report (`report`): a lead sentence about a town (what happened there), then a few facts about people of that
  town: the text of `elastic_bench.training.record_text.GeneratedText`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SYLLABLES = ("ba be da do fa fe ga go ka ke la lo ma me na no pa pe ra ro sa se ta to va ve za zo bri dra "
             "kel mor nis sel tam ver lin dor fen gal rik sum tev").split()
TOWN_ENDINGS = ("wick", "ford", "mere", "holt", "bury", "stead", "vale", "port", "moor", "field")
TRADES = ("beekeeper", "cartographer", "glassblower", "ferry pilot", "clockmaker", "botanist", "stonemason",
          "weaver", "archivist", "luthier", "brewer", "surveyor", "bookbinder", "lamplighter", "cooper", "tailor")
INSTRUMENTS = ("cello", "oboe", "harp", "bassoon", "zither", "trumpet", "viola", "accordion", "flute", "marimba")
BUILDINGS = ("library", "bakery", "bridge", "school", "market hall", "clinic", "museum", "harbour", "mill", "theatre")
EVENTS = ("lantern fair", "harvest market", "rowing race", "flower show", "winter concert", "chess tournament")
WEATHER = ("snow", "rain", "fog", "wind", "hail")
SEASONS = ("spring", "summer", "autumn", "winter")


@dataclass(frozen=True)
class Attribute:
    """One kind of fact about a person: its statement, the question asking for it (``{subject}``: a name or a phrase
    naming the person), and how to draw a value."""

    name: str
    statement: str  # "{person} ... {value}."
    question: str  # "... {subject} ...?"

    def value(self, rng: np.random.Generator) -> str:
        if self.name == "town":
            return town(rng)
        if self.name == "year":
            return str(int(rng.integers(1850, 1995)))
        return str(rng.choice(TRADES if self.name == "trade" else INSTRUMENTS))

    def fact(self, person: str, value: str) -> str:
        if self.name == "trade":
            value = ("an " if value[0] in "aeiou" else "a ") + value
        return self.statement.format(person=person, value=value)


ATTRIBUTES = (
    Attribute("town", "{person} grew up in the town of {value}.", "In which town did {subject} grow up?"),
    Attribute("trade", "{person} earns a living as {value}.", "What does {subject} do for a living?"),
    Attribute("year", "{person} was born in {value}.", "In which year was {subject} born?"),
    Attribute("instrument", "{person} plays the {value} in a small band.", "Which instrument does {subject} play?"),
)


@dataclass(frozen=True)
class Relation:
    """A relation between two people: its statement and the phrase that names the second through the first."""

    statement: str  # "{a} ... {b}."
    phrase: str  # "the person {a} ..."


RELATIONS = (
    Relation("{a} learned the trade from {b}.", "the person {a} learned the trade from"),
    Relation("{a} shares a house with {b}.", "the person {a} shares a house with"),
    Relation("{a} writes letters every month to {b}.", "the person {a} writes letters to every month"),
)


def _word(rng: np.random.Generator, syllables: int) -> str:
    return "".join(str(rng.choice(SYLLABLES)) for _ in range(syllables)).capitalize()


def person(rng: np.random.Generator) -> str:
    """An invented name: a given name of two syllables and a family name of two or three."""
    return f"{_word(rng, 2)} {_word(rng, int(rng.integers(2, 4)))}"


def town(rng: np.random.Generator) -> str:
    """An invented town: one or two syllables and a place-name ending."""
    return _word(rng, int(rng.integers(1, 3))) + str(rng.choice(TOWN_ENDINGS))


def lead(rng: np.random.Generator, place: str) -> str:
    """The lead sentence of a report about ``place``: what happened there."""
    kind = int(rng.integers(4))
    if kind == 0:
        return f"{place} opened a new {rng.choice(BUILDINGS)} this {rng.choice(SEASONS)}."
    if kind == 1:
        return f"The {rng.choice(EVENTS)} in {place} drew visitors from the whole valley."
    if kind == 2:
        return f"Heavy {rng.choice(WEATHER)} closed the roads around {place} for three days."
    return f"The council of {place} chose {person(rng)} as its new chair."


def report(rng: np.random.Generator) -> list[str]:
    """A report: its lead about a town, then two to four facts about people of that town (sentences)."""
    place = town(rng)
    sentences = [lead(rng, place)]
    for _ in range(int(rng.integers(2, 5))):
        attribute = ATTRIBUTES[int(rng.integers(1, len(ATTRIBUTES)))]  # the town is the report's own
        sentences.append(attribute.fact(f"{person(rng)} of {place}", attribute.value(rng)))
    return sentences
