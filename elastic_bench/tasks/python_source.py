"""Python source files read as a corpus of lines: what the code tasks read (`code_completion` over the installed
torch package, the router records' ``code`` task over the standard library)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

FILE_HEADER = "# file: "
"""The line that opens each file in `stream`, followed by the file's path."""


def read_files(root: Path, files: Iterable[Path], longest: int) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``(path relative to root, its lines with trailing whitespace stripped)`` of each of ``files`` in order; a file
    that is empty, not UTF-8, unreadable, or holds a line longer than ``longest`` characters is left out."""
    kept = []
    for file in files:
        try:
            lines = tuple(line.rstrip() for line in file.read_text(encoding="utf-8").splitlines())
        except (UnicodeDecodeError, OSError):
            continue
        if lines and max(map(len, lines)) <= longest:
            kept.append((file.relative_to(root).as_posix(), lines))
    return tuple(kept)


def stream(files: Iterable[tuple[str, tuple[str, ...]]]) -> tuple[str, ...]:
    """The lines of ``files`` (as `read_files` gives them) one after another, each file opened by a
    ``# file: <path>`` line."""
    lines: list[str] = []
    for path, text in files:
        lines += [f"{FILE_HEADER}{path}", *text]
    return tuple(lines)
