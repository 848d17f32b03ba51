"""DuoAttention's synthetic training data: multi-passkey retrieval on a haystack corpus.

Upstream ``mit-han-lab/duo-attention``, ``duo_attn/data.py`` (``MultiplePasskeyRetrievalDataset``) and
``scripts/train.sh``, re-implemented from a reading of them:

- A sample is ``prompt1 + context + prompt2 + QA``: ``prompt1`` is "<|im_start|> This is a very long story book:
  <book> " (with the tokenizer's BOS), ``prompt2`` " </book>.\\n\\n"; the context is the corpus' first tokens with
  `PasskeyData.num_passkeys` needles inserted at sorted depths, each "\\n\\n" + "Remeber this sequence of words, it's
  the {ordinal} passkey to the vault: " (upstream's spelling) + the passkey + "\\n\\n"; the QA part asks for every
  passkey in order: "Based on the content of the book, what is the {ordinal} passkey to the vault?\\nPasskey: " +
  the passkey + "\\n\\n". The loss positions are the QA part's (upstream's labels).
- A passkey is `PasskeyData.passkey_length` words drawn from a pool (upstream: the 26 NATO-alphabet words).
- Lengths: ``linspace(min_length, max_length, num_lengths)``, visited in a seeded random order per epoch; depths: a
  sorted draw without replacement from ``linspace(min_depth, max_depth, depth_intervals)``.
- One difference: here a length is the sample's *total* token count (a multiple of 16, as upstream pads to), so
  ``max_length`` is what the model must hold; upstream's length counts the haystack tokens and caps the total at
  ``context_length_max - 300``.
- Every sample is a pure function of ``(seed, step, slot)``, so a resumed run sees the samples an uninterrupted one
  sees.

Instead of passkeys, ``kind="text"`` (train-prulong's default) makes each sample a row of ``max_length``
consecutive haystack tokens (the tokenizer's BOS first) at a seeded offset into the haystack's first
``TEXT_ROWS × max_length`` tokens, every token carrying the loss: natural long text, as PruLong trains.

Instead of passkeys, ``records`` trains on prompt/answer records (`elastic_bench.training.records`: e.g. what
``elastic-bench
testbed data`` writes): each sample is one record, its prompt through the tokenizer's chat template, then the answer,
whose tokens carry the loss; records are visited in a seeded random order per epoch.

The haystack: a local text, JSON (``{"text": ...}`` or a list of them, e.g. RULER's ``PaulGrahamEssays.json``) or
JSON Lines (a ``"text"`` field per line, e.g. upstream's booksum) corpus; by default RULER's essays when the data
directory holds ``ruler/PaulGrahamEssays.json``, else a generated one (the testbed's "The {noun} is {adjective}."
sentences, seeded).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from elastic_bench.training.provenance import epoch_tokens

NATO = tuple("alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike november oscar papa "
             "quebec romeo sierra tango uniform victor whiskey xray yankee zulu".split())
DIGITS = tuple("0123456789")
ORDINALS = tuple("first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth thirteenth "
                 "fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth twentieth".split())
PROMPT1 = "<|im_start|> This is a very long story book: <book> "
PROMPT2 = " </book>.\n\n"
NEEDLE = "Remeber this sequence of words, it's the {ordinal} passkey to the vault: "
QUESTION = "Based on the content of the book, what is the {ordinal} passkey to the vault?\nPasskey: "
SEPARATOR = "\n\n"
MULTIPLE = 16  # sample lengths are multiples of this (upstream pads to it)
UPSTREAM_LENGTHS = (1000, 32000)  # upstream's shortest and longest samples (scripts/train.sh)
UPSTREAM_PASSKEYS = (10, 32)  # upstream's passkeys per sample and words per passkey
HAYSTACK_SHARE = 0.25  # a chosen min_length holds the passkeys' tokens and this fraction more of haystack
TEXT_ROWS = 4  # text rows are cut from the haystack's first TEXT_ROWS × max_length tokens (at least max_length)
ESSAYS = "ruler/PaulGrahamEssays.json"
ESSAYS_IDENTITY = "dataset:paul_graham_essays"  # RULER's essays: only its haystack, so no RULER task's identity
GENERATED_IDENTITY = "generator:testbed.noise"  # the generated haystack: the testbed's noise, which only pads too


@dataclass
class PasskeyData:
    """The training data of the gate trainers (defaults: upstream's ``scripts/train.sh``).

    Attributes:
        haystack: the haystack corpus: a ``.txt``, ``.json`` or ``.jsonl`` file, or ``generated``; None: RULER's essays
            (``ruler/PaulGrahamEssays.json`` under --data-dir) when present, else generated.
        data_dir: data directory searched for RULER's essays (None: ``$ELASTIC_BENCH_DATA``).
        min_length: shortest sample, in tokens (its total length); None: upstream's 1000, or more where the passkeys
            need it (their tokens and a quarter more of haystack), at most ``max_length``.
        max_length: longest sample, in tokens; at most the model's positions; None: upstream's 32000, or the model's
            positions when fewer.
        num_lengths: lengths between the two (``linspace``).
        num_passkeys: passkeys per sample (at most 20); None: upstream's 10, fewer where 10 would take more than half
            of ``max_length``.
        passkey_length: words per passkey; None: upstream's 32, halved while one passkey would still take more than
            half of ``max_length``.
        passkey_words: the words passkeys are drawn from: ``nato`` (upstream's), ``digits``, a file of words (one per
            line), or ``auto`` (nato, or digits when the tokenizer spells a NATO word with its unknown token).
        min_depth, max_depth: range of needle depths (fraction of the context).
        depth_intervals: depths between the two (``linspace``).
        kind: what a sample is: ``passkeys`` (the multi-passkey retrieval above, the loss on its QA part) or ``text``
            (a row of ``max_length`` consecutive haystack tokens at a seeded offset, natural text when the haystack
            is a corpus, the loss on every token: ProLong's packed long documents, which PruLong trains on; the
            length and passkey options then do not apply); None: the trainer's (train-duo ``passkeys``,
            train-prulong ``text``).
        records: prompt/answer training records (a ``.jsonl``/``.parquet`` file or a folder of them) used instead of
            the passkey data (the length, passkey and depth options then do not apply; ``max_length`` truncates).
    """

    haystack: str | None = None
    data_dir: str | None = None
    min_length: int | None = None
    max_length: int | None = None
    num_lengths: int = 50
    num_passkeys: int | None = None
    passkey_length: int | None = None
    passkey_words: str = "auto"
    min_depth: float = 0.05
    max_depth: float = 0.95
    depth_intervals: int = 1000
    kind: Literal["passkeys", "text"] | None = None
    records: str | None = None

    def __post_init__(self):
        lengths_given = self.min_length is not None and self.max_length is not None and self.records is None
        checks = {
            "min_length must be >= 16": self.min_length is None or self.min_length >= MULTIPLE,
            "max_length must be >= 16": self.max_length is None or self.max_length >= MULTIPLE,
            "max_length must be >= min_length": not lengths_given or self.max_length >= self.min_length,
            "num_lengths must be >= 1": self.num_lengths >= 1,
            f"num_passkeys must lie in [1, {len(ORDINALS)}]": self.num_passkeys is None
            or 1 <= self.num_passkeys <= len(ORDINALS),
            "passkey_length must be >= 1": self.passkey_length is None or self.passkey_length >= 1,
            "depths must satisfy 0 <= min_depth <= max_depth <= 1": 0 <= self.min_depth <= self.max_depth <= 1,
            "depth_intervals must be >= num_passkeys": self.depth_intervals >= (self.num_passkeys or 1),
        }
        failed = [message for message, ok in checks.items() if not ok]
        if failed:
            raise ValueError("; ".join(failed))
        if self.records is not None and not Path(self.records).exists():
            raise FileNotFoundError(f"--records: no file or folder at {self.records}")
        if self.haystack not in (None, "generated") and not Path(self.haystack).is_file():
            raise FileNotFoundError(f"--haystack: no file at {self.haystack} (a .txt, .json or .jsonl corpus, or "
                                    "'generated')")
        if self.passkey_words not in ("auto", "nato", "digits") and not Path(self.passkey_words).is_file():
            raise FileNotFoundError(f"--passkey-words: no file at {self.passkey_words} (auto, nato, digits or a "
                                    "file of words)")

    def haystack_source(self) -> str:
        """Where the haystack comes from: a file path, or ``generated``."""
        if self.haystack is not None:
            return self.haystack
        from elastic_bench.tasks.corpora import data_root

        root = data_root(self.data_dir)
        essays = root / ESSAYS if root else None
        return str(essays) if essays is not None and essays.is_file() else "generated"


@dataclass(frozen=True)
class PasskeySample:
    """One training sample.

    Attributes:
        input_ids: ``[T]`` token ids (``T`` a multiple of 16).
        answer_start: where the QA part starts: positions ``answer_start … T-1`` carry the loss.
    """

    input_ids: torch.Tensor
    answer_start: int

    def answer_mask(self) -> torch.Tensor:
        """``[T]`` bool, True on the QA part."""
        mask = torch.zeros(len(self.input_ids), dtype=torch.bool)
        mask[self.answer_start:] = True
        return mask


class PromptPieces:
    """A tokenizer's encodings of the sample's fixed texts (cached), and what a set of passkeys adds to a sample.

    Attributes:
        prompt1: ``PROMPT1`` encoded with the tokenizer's special tokens (its BOS).
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.prompt1 = tokenizer.encode(PROMPT1, add_special_tokens=True)
        self._encoded: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        """``text``'s token ids, without special tokens."""
        if text not in self._encoded:
            self._encoded[text] = self.tokenizer.encode(text, add_special_tokens=False)
        return self._encoded[text]

    def needles(self, keys: list[list[int]]) -> list[list[int]]:
        """The needle of each passkey (token ids ``keys[i]``), without its separators."""
        return [self.encode(NEEDLE.format(ordinal=ORDINALS[i])) + key for i, key in enumerate(keys)]

    def questions(self, keys: list[list[int]]) -> list[int]:
        """The QA part: every passkey's question, the passkey and a separator, in order."""
        sep = self.encode(SEPARATOR)
        return [t for i, key in enumerate(keys) for t in self.encode(QUESTION.format(ordinal=ORDINALS[i])) + key + sep]

    def overhead(self, keys: list[list[int]]) -> int:
        """Tokens of a sample that are not haystack: the prompts, the needles with their separators, the QA part."""
        sep = len(self.encode(SEPARATOR))
        return (len(self.prompt1) + len(self.encode(PROMPT2)) + len(self.questions(keys))
                + sum(len(n) + 2 * sep for n in self.needles(keys)))


def passkey_tokens(pieces: PromptPieces, words: tuple[str, ...], num_passkeys: int, passkey_length: int) -> int:
    """The tokens of a sample that are not haystack when each of its ``num_passkeys`` passkeys repeats the word of
    ``words`` that takes the most tokens ``passkey_length`` times: what the passkeys need at most."""
    longest = max(words, key=lambda word: len(pieces.encode(" " + word)))
    key = pieces.encode(" ".join([longest] * passkey_length))
    return pieces.overhead([key] * num_passkeys)


def fit_passkeys(data: PasskeyData, tokenizer, positions: int) -> PasskeyData:
    """``data`` with the options left unset (None) chosen for a model of ``positions`` positions and its tokenizer, as
    `PasskeyData` describes; given values are kept.

    Raises:
        ValueError: given values that cannot hold together (one line naming the flags): a ``min_length`` above the
            longest sample or below what the passkeys need, passkeys that do not fit in the longest sample.
    """
    max_length = data.max_length or min(UPSTREAM_LENGTHS[1], positions)
    if data.records is not None or data.kind == "text":
        return replace(data, max_length=max_length)
    longest = f"--max-length {max_length}" + ("" if data.max_length else " (chosen for the model)")
    if data.min_length is not None and data.min_length > max_length:
        raise ValueError(f"--min-length {data.min_length} exceeds {longest}")
    pieces = PromptPieces(tokenizer)
    words = passkey_words(data.passkey_words, tokenizer)
    count = data.num_passkeys or min(UPSTREAM_PASSKEYS[0], data.depth_intervals)
    size = data.passkey_length or UPSTREAM_PASSKEYS[1]
    while passkey_tokens(pieces, words, count, size) > max_length // 2:  # fewer passkeys, then shorter ones
        if data.num_passkeys is None and count > 1:
            count -= 1
        elif data.passkey_length is None and size > 1:
            size //= 2
        else:
            break
    needed = passkey_tokens(pieces, words, count, size)
    passkeys = f"{count} passkeys of {size} words and their questions"
    if needed > max_length:
        raise ValueError(f"{passkeys} take up to {needed} tokens, more than {longest}; lower --num-passkeys / "
                         "--passkey-length")
    if data.min_length is not None and data.min_length < needed:
        raise ValueError(f"min_length {data.min_length} is below the {needed} tokens that {passkeys} take at most; "
                         "raise --min-length or lower --num-passkeys / --passkey-length")
    with_haystack = math.ceil(needed * (1 + HAYSTACK_SHARE) / MULTIPLE) * MULTIPLE
    min_length = data.min_length or min(max_length, max(UPSTREAM_LENGTHS[0], with_haystack))
    return replace(data, min_length=min_length, max_length=max_length, num_passkeys=count, passkey_length=size)


class PasskeySamples(torch.utils.data.Dataset):
    """Item ``step``: the samples of the slots ``rank, rank + world_size, … < per_step`` of that step.

    Args:
        data: what to generate.
        tokenizer: the model's tokenizer.
        seed: seed of the sample stream.
        per_step: samples per optimizer step, over all ranks.
        rank, world_size: this process among the ranks.
    """

    def __init__(self, data: PasskeyData, tokenizer, seed: int, per_step: int, rank: int = 0, world_size: int = 1):
        self.data, self.tokenizer, self.seed, self.per_step = data, tokenizer, seed, per_step
        self.rank, self.world_size = rank, world_size
        self.records, self.examples = _record_samples(data, tokenizer) if data.records else (None, None)
        if self.examples is not None:
            return
        if data.kind == "text":
            self.bos = tokenizer.encode("", add_special_tokens=True)  # the tokenizer's BOS, if it adds one
            self.haystack_tokens = haystack_tokens(data.haystack_source(), tokenizer, TEXT_ROWS * data.max_length,
                                                   seed, minimum=data.max_length)
            return
        self.lengths = np.linspace(data.min_length, data.max_length, data.num_lengths).astype(np.int64)
        self.depths = np.linspace(data.min_depth, data.max_depth, data.depth_intervals)
        self.words = passkey_words(data.passkey_words, tokenizer)
        self.haystack_tokens = haystack_tokens(data.haystack_source(), tokenizer, data.max_length, seed)
        self.pieces = PromptPieces(tokenizer)
        shortest = self.sample(0, 0, length=int(self.lengths.min()), check=False)
        if len(shortest.input_ids) > self.lengths.min():
            raise ValueError(f"min_length {data.min_length} is below the {len(shortest.input_ids)} tokens that "
                             f"{data.num_passkeys} passkeys of {data.passkey_length} words and their questions take; "
                             "raise --min-length or lower --num-passkeys / --passkey-length")

    def __getitem__(self, step: int) -> list[PasskeySample]:
        return [self.sample(step, slot) for slot in range(self.rank, self.per_step, self.world_size)]

    def sample(self, step: int, slot: int, length: int | None = None, check: bool = True) -> PasskeySample:
        """The sample of ``slot`` at ``step`` (``length`` overrides its length)."""
        if self.examples is not None:
            return self.examples[self._visit(step, slot, len(self.examples))]
        rng = np.random.default_rng([self.seed, step, slot])
        if self.data.kind == "text":
            row = self.data.max_length - len(self.bos)
            start = int(rng.integers(0, len(self.haystack_tokens) - row + 1))
            return PasskeySample(torch.tensor(self.bos + self.haystack_tokens[start:start + row]), 0)
        if length is None:
            length = int(self.lengths[self._visit(step, slot, len(self.lengths))])
        depths = np.sort(rng.choice(self.depths, self.data.num_passkeys, replace=False))
        keys = [self.tokenizer.encode(" ".join(rng.choice(self.words, self.data.passkey_length)),
                                      add_special_tokens=False) for _ in range(self.data.num_passkeys)]
        pieces = self.pieces
        sep = pieces.encode(SEPARATOR)
        needles, qa = pieces.needles(keys), pieces.questions(keys)
        overhead = pieces.overhead(keys)
        filler = length - overhead  # haystack tokens: the total is `length` rounded down to a multiple of 16 ...
        if filler >= length % MULTIPLE:
            filler -= length % MULTIPLE
        else:  # ... unless the rest alone exceeds it: then the next multiple of 16 above the rest (refused if checked)
            filler = -overhead % MULTIPLE
        context: list[int] = []
        last = 0
        hay = self.haystack_tokens[:filler]
        for depth, needle in zip(depths, needles):
            point = int(len(hay) * depth)
            context += hay[last:point] + sep + needle + sep
            last = point
        context += hay[last:]
        ids = pieces.prompt1 + context + pieces.encode(PROMPT2)
        sample = PasskeySample(torch.tensor(ids + qa, dtype=torch.int64), len(ids))
        if check and len(sample.input_ids) > self.data.max_length:
            raise ValueError(f"a sample of {len(sample.input_ids)} tokens exceeds max_length {self.data.max_length}")
        return sample

    def _visit(self, step: int, slot: int, count: int) -> int:
        """Which of ``count`` items the slot's sample takes: a seeded permutation per epoch (`_order`)."""
        epoch, offset = divmod(step * self.per_step + slot, count)
        return int(self._order(count, epoch)[offset])

    def _order(self, count: int, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch, 7919]).permutation(count)

    def _sizes(self) -> list[int]:
        """The tokens of each item the samples are drawn from (in `_visit`'s order): a record, a length (rounded down
        to a multiple of 16, what a passkey sample of it holds), or the one size of a text row."""
        if self.examples is not None:
            return [len(e.input_ids) for e in self.examples]
        if self.data.kind == "text":
            return [self.data.max_length]
        return [int(length - length % MULTIPLE) for length in self.lengths]

    def tokens_seen(self, steps: int) -> int:
        """The tokens of the samples of the first ``steps`` steps, over all ranks."""
        sizes = self._sizes()
        return epoch_tokens(sizes, steps * self.per_step, lambda epoch: self._order(len(sizes), epoch))

    def data_provenance(self, steps: int) -> dict:
        """The ``data`` block of the gates' provenance (`elastic_bench.training.provenance`) for a run of ``steps``
        steps: records read from a file (their identities, tasks and digest), or data generated step by step (the
        digest of its definition; passkeys: DuoAttention's passkey generator, whose haystack only pads; text rows:
        the haystack, which is what they hold)."""
        from elastic_bench.training.make_records import PASSKEY_GENERATOR
        from elastic_bench.training.provenance import (
            data_provenance,
            definition_digest,
            record_identities,
        )
        from elastic_bench.training.records import record_task

        sizes = self._sizes()
        if self.examples is not None:
            tasks = dict(record_task(r) for r in self.records)
            return data_provenance("file", _digest(Path(self.data.records)), record_identities(self.records), tasks,
                                   (min(sizes), max(sizes)), len(self.records), path=self.data.records)
        haystack = self.data.haystack_source()
        settings = {k: v for k, v in dataclasses.asdict(self.data).items() if k not in ("haystack", "data_dir")}
        definition = {**settings, "seed": self.seed,
                      "haystack": "generated" if haystack == "generated" else _digest(Path(haystack))}
        drawn = steps * self.per_step
        if self.data.kind == "text":
            return data_provenance("synthetic", definition_digest(definition), [haystack_identity(haystack)],
                                   {"text": None}, (min(sizes), max(sizes)), drawn)
        return data_provenance("synthetic", definition_digest(definition), [PASSKEY_GENERATOR],
                               {"passkey": "sensitive"}, (min(sizes), max(sizes)), drawn)

    def settings(self) -> dict:
        """What the run's settings record about the data: the haystack's source and the passkey words."""
        if self.examples is not None:
            return {"records": self.data.records, "num_records": len(self.examples)}
        if self.data.kind == "text":
            return {"haystack_source": self.data.haystack_source(), "text_tokens": len(self.haystack_tokens)}
        return {"haystack_source": self.data.haystack_source(), "passkey_pool": list(self.words)}


def _record_samples(data: PasskeyData, tokenizer) -> tuple[list[dict], list[PasskeySample]]:
    """The records of ``data.records`` and their samples (chat-template prompt + answer + EOS, at most
    ``max_length``)."""
    from elastic_bench.training.engine import tokenize
    from elastic_bench.training.records import located_records, to_example

    located = located_records(data.records)  # read once: the records and their places, for a bad record's message
    records = [record for _, record in located]
    examples = [to_example(record, where) for where, record in located]
    if not examples:
        raise ValueError(f"--records {data.records} holds no records")
    categories = sorted({e.category for e in examples})
    return records, [PasskeySample(t.input_ids, t.prompt_len) for t in tokenize(examples, tokenizer, categories,
                                                                                  data.max_length)]


def _digest(path: Path) -> str:
    """SHA-256 of a haystack or records file, or of a records folder's files."""
    from elastic_bench.training.records import files_sha256, record_files

    return files_sha256(path, record_files(path))


def haystack_identity(source: str) -> str:
    """What a haystack (`PasskeyData.haystack_source`) is, as an identity: `GENERATED_IDENTITY`, `ESSAYS_IDENTITY`
    for RULER's essays (by their file's name), else ``corpus:`` and the first 16 hex digits of its SHA-256."""
    if source == "generated":
        return GENERATED_IDENTITY
    if Path(source).name == Path(ESSAYS).name:
        return ESSAYS_IDENTITY
    return "corpus:" + _digest(Path(source))[:16]


def passkey_words(choice: str, tokenizer) -> tuple[str, ...]:
    """The word pool ``choice`` names (`PasskeyData.passkey_words`) for ``tokenizer``.

    Raises:
        ValueError: the pool is empty, or the tokenizer spells one of its words with its unknown token.
    """
    if choice == "auto":
        return NATO if _spellable(NATO, tokenizer) else DIGITS
    words = {"nato": NATO, "digits": DIGITS}.get(choice)
    if words is None:
        words = tuple(w for w in Path(choice).read_text(encoding="utf-8").split() if w)
        if not words:
            raise ValueError(f"--passkey-words: {choice} holds no words")
    if not _spellable(words, tokenizer):
        raise ValueError(f"--passkey-words {choice}: the tokenizer spells some of its words with its unknown token; "
                         "use digits or a file of words it knows")
    return tuple(words)


def _spellable(words, tokenizer) -> bool:
    unk = getattr(tokenizer, "unk_token_id", None)
    return unk is None or all(unk not in tokenizer.encode(" " + w, add_special_tokens=False) for w in words)


def haystack_tokens(source: str, tokenizer, max_length: int, seed: int, minimum: int | None = None) -> list[int]:
    """The first ``max_length`` tokens of the haystack ``source`` (fewer when the corpus ends first).

    Raises:
        ValueError: the corpus file holds no text, or fewer than ``minimum`` tokens (None: ``max_length``).
    """
    minimum = max_length if minimum is None else minimum
    budget = 16 * max_length  # characters: enough for max_length tokens of any tokenizer
    text = generated_haystack(budget, seed) if source == "generated" else _corpus_text(Path(source), budget)
    chars = 4 * max_length  # the encoded prefix grows until it holds max_length tokens: never much more than needed
    while True:
        tokens = tokenizer.encode(text[:chars], add_special_tokens=False)
        if len(tokens) >= max_length or chars >= len(text):
            break
        chars *= 2
    if len(tokens) < minimum:
        raise ValueError(f"the haystack {source} has {len(tokens)} tokens, fewer than the {minimum} its samples need")
    return tokens[:max_length]


def generated_haystack(chars: int, seed: int) -> str:
    """About ``chars`` characters of seeded noise sentences (`elastic_bench.testbed.text.sentence`: the testbed's
    haystack words, which every English tokenizer spells)."""
    from elastic_bench.testbed import text

    rng = np.random.default_rng([seed, 1])
    sentences: list[str] = []
    size = 0
    while size < chars:
        sentences.append(text.sentence(rng))
        size += len(sentences[-1]) + 1
    return " ".join(sentences)


def _corpus_text(path: Path, chars: int) -> str:
    """The concatenated texts of a corpus file, read until ``chars`` characters."""
    try:
        if path.suffix == ".jsonl":
            pieces, size = [], 0
            with path.open(encoding="utf-8") as handle:
                for number, line in enumerate(handle, 1):
                    if line.strip():
                        piece = _text_of(json.loads(line), f"{path}:{number}")
                        pieces.append(piece)
                        size += len(piece)
                        if size >= chars:
                            break
            text = "".join(pieces)
        elif path.suffix == ".json":
            loaded = json.loads(path.read_text(encoding="utf-8"))
            rows = loaded if isinstance(loaded, list) else [loaded]
            text = "".join(_text_of(row, str(path)) for row in rows)
        else:
            text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"--haystack {path} is not a readable text/JSON corpus: {err}") from None
    if not text.strip():
        raise ValueError(f"--haystack {path} holds no text")
    return text


def _text_of(row, where: str) -> str:
    if not isinstance(row, dict) or not isinstance(row.get("text"), str):
        raise ValueError(f"{where}: expected an object with a 'text' string")
    return row["text"]
