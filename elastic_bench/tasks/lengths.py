"""Length bins for benchmarks whose records come at fixed lengths (MRCR, GraphWalks): a run at length L holds the
records whose tokens (with the model's tokenizer) fall in ``(L/2, L]``.

At a power-of-two length this is exactly one of MRCR's bins (``(4096, 8192]``, ``(8192, 16384]``, … ``(524288,
1048576]``; its first bin is closed, and no record has 4096 tokens or fewer); lengths between powers of two get the
same rule, so every record fits the run's length and none appears at two lengths of a doubling sweep.
"""

from __future__ import annotations

MAX_CHARS_PER_TOKEN = 16
"""A record of more characters than this many per token of the run's length is taken not to fit without tokenizing
it (English text averages 4 to 5 characters per token; MRCR prompts reach 5 million characters)."""


def in_bin(tokens: int, length: int) -> bool:
    """Whether a record of ``tokens`` tokens belongs to the run at ``length``: ``length / 2 < tokens <= length``."""
    return length / 2 < tokens <= length


def may_fit(characters: int, length: int) -> bool:
    """Whether a record of ``characters`` characters can fit ``length`` tokens (see `MAX_CHARS_PER_TOKEN`)."""
    return characters <= MAX_CHARS_PER_TOKEN * length
