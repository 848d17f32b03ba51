"""The testbed's word-level vocabulary and tokenizer, built offline from `elastic_bench.testbed.text`.

One token per word (template words, haystack words, pseudo-word keys) and per punctuation mark; numbers are split into
pairs of digits from the left (``1234567`` → ``12 ##34 ##56 ##7``, WordPiece continuation tokens), so that the
tokenizer decodes them back without spaces and a 7-digit value opens with one of 90 tokens: a model that cannot see
the needle guesses its first token right about 1% of the time (with single digits, 11%: enough, under a sparse
prefill and a dense decode, for the decode steps to complete the rest; docs/testbed.md, "Why pairs of digits").
Every prompt starts with ``<s>``; generation ends with ``</s>``. The tokenizer is saved in the usual transformers
format (``tokenizer.json``, ``tokenizer_config.json``) next to the model and has no chat template.
"""

from __future__ import annotations

from functools import cached_property, lru_cache

import numpy as np

from . import text

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
SPECIALS = (PAD, UNK, BOS, EOS)
PUNCTUATION = (".", "?", ",")
NUMBERS = tuple(str(n) for n in range(10)) + tuple(f"{n:02d}" for n in range(100))  # a number's first piece
NUMBER_PIECES = NUMBERS + tuple(f"##{n}" for n in NUMBERS)  # and its later ones


class Vocab:
    """The testbed vocabulary: ``tokens[i]`` is the string of id ``i``.

    Encoding and decoding go through the same `tokenizers` backend that the saved transformers tokenizer uses, so the
    ids the data generators build and the ids a loaded tokenizer produces from the decoded text agree.
    """

    def __init__(self, tokens: tuple[str, ...]):
        self.tokens = tokens
        self.index = {t: i for i, t in enumerate(tokens)}
        if len(self.index) != len(tokens):
            raise ValueError("vocabulary tokens must be distinct")
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = (self.index[t] for t in SPECIALS)
        self.key_ids = np.array([self.index[k] for k in text.keys()], dtype=np.int64)
        self.noun_ids = np.array([self.index[w] for w in text.NOUNS], dtype=np.int64)
        self.adjective_ids = np.array([self.index[w] for w in text.ADJECTIVES], dtype=np.int64)
        self.verb_ids = np.array([self.index[w] for w in text.VERBS], dtype=np.int64)
        self.number_ids = np.array([self.index[n] for n in NUMBERS], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def backend(self):
        """The `tokenizers.Tokenizer`: WordPiece over this vocabulary, BERT pre-tokenisation (whitespace and
        punctuation), ``<s>`` prepended."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

        backend = Tokenizer(models.WordPiece(vocab=dict(self.index), unk_token=UNK, max_input_chars_per_word=64))
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##", cleanup=True)
        backend.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, self.bos_id)])
        backend.add_special_tokens(list(SPECIALS))
        return backend

    def encode(self, words: str) -> np.ndarray:
        """Ids of ``words`` without ``<s>``; raises ValueError if a word is not in the vocabulary."""
        ids = np.array(self.backend.encode(words, add_special_tokens=False).ids, dtype=np.int64)
        if (ids == self.unk_id).any():
            raise ValueError(f"text outside the testbed vocabulary: {words!r}")
        return ids

    def number(self, value: int) -> np.ndarray:
        """Ids of a non-negative integer: its digits in pairs from the left, the first pair a `NUMBERS` token, the
        others continuation tokens (``1234567`` → ``12 ##34 ##56 ##7``), as the tokenizer splits it."""
        digits = str(value)
        pieces = [digits[i : i + 2] for i in range(0, len(digits), 2)]
        return np.array([self.index[p] for p in [pieces[0], *(f"##{p}" for p in pieces[1:])]], dtype=np.int64)

    def decode(self, ids) -> str:
        """Text of ``ids`` (special tokens dropped)."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=True)

    def save_tokenizer(self, directory) -> None:
        """Save `tokenizer` to ``directory`` (``tokenizer.json``, ``tokenizer_config.json``), with the class name
        ``PreTrainedTokenizerFast`` that transformers 4.x and 5.x both load."""
        import json
        from pathlib import Path

        self.tokenizer().save_pretrained(directory)
        config_path = Path(directory) / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_path.write_text(json.dumps(config, indent=2) + "\n")

    def tokenizer(self):
        """A transformers tokenizer over this vocabulary (``save_pretrained`` writes the usual files)."""
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(
            tokenizer_object=self.backend, bos_token=BOS, eos_token=EOS, unk_token=UNK, pad_token=PAD,
            model_max_length=1 << 16, clean_up_tokenization_spaces=False,
        )


@lru_cache(maxsize=1)
def build() -> Vocab:
    """The testbed vocabulary (~4.5K tokens): specials, punctuation, number pieces, template words, haystack words,
    keys."""
    words = [*text.template_words(), *text.NOUNS, *text.ADJECTIVES, *text.VERBS, *text.keys()]
    ordered = dict.fromkeys([*SPECIALS, *PUNCTUATION, *NUMBER_PIECES, *words])
    return Vocab(tuple(ordered))
