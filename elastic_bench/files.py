"""Writing files so that a reader never sees half of one: the one atomic-write helper, and JSON Lines.

An atomic write goes to a temporary file in the target's folder, is flushed to disk, then renamed over the target
(``os.replace``, atomic on POSIX): an interrupted write leaves the old file or the new one, never a torn one.

Part of the foundation: imports nothing of elastic-bench, so every pillar may use it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; when the block ends without error, it replaces ``path``.

    For writers that take a file name (``safetensors.torch.save_file``, ``numpy.savetxt``)::

        with atomic_path(out / "router.safetensors") as tmp:
            save_file(tensors, str(tmp))
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, data: Any) -> None:
    """Write ``data`` as indented JSON atomically (values JSON does not know are written with ``str``)."""
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def write_jsonl(path: str | Path, records: list[dict[str, Any]]) -> None:
    """Write ``records`` as JSON Lines atomically (replacing the file)."""
    write_text(path, "".join(json.dumps(r) + "\n" for r in records))


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one record to a JSON Lines file and flush it to disk before returning."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSON Lines file ([] when it does not exist); a torn last line (an interrupted append) is
    dropped."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records
