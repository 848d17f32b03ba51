"""Files that a reader never sees half of, and folders that one process writes at a time: the one atomic-write
helper, JSON Lines, content digests, and the output-folder lock.

An atomic write goes to a temporary file in the target's folder, is flushed to disk, then renamed over the target
(``os.replace``, atomic on POSIX): an interrupted write leaves the old file or the new one, never a torn one.

Part of the foundation: imports nothing of elastic-bench, so every pillar may use it.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_TMP_SUFFIX = ".tmp"


def stray_temporaries(path: str | Path) -> list[Path]:
    """The temporary files that atomic writes of ``path`` left behind (a writer killed before its rename); only
    meaningful while no other process writes ``path``."""
    path = Path(path)
    return sorted(path.parent.glob(f".{glob.escape(path.name)}.*{_TMP_SUFFIX}"))


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; when the block ends without error, it replaces ``path``.

    For writers that take a file name (``safetensors.torch.save_file``, ``numpy.savetxt``)::

        with atomic_path(out / "router.safetensors") as tmp:
            save_file(tensors, str(tmp))
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TMP_SUFFIX)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes the file private; a result file has the usual mode
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


def digest(path: str | Path) -> str:
    """SHA-256 (hex) of a file's bytes, or of a folder's files (each file's relative path and bytes, sorted by path):
    what a learned artifact holds, wherever it lies."""
    path = Path(path)
    sha = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if file != path:
            sha.update(f"{file.relative_to(path).as_posix()}\0".encode())
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                sha.update(block)
    return sha.hexdigest()


def read_table(path: str | Path, what: str, layout: str):
    """A tab-separated table of numbers (``numpy`` float64 ``[rows, columns]``), e.g. head gates or thresholds.

    Args:
        path: the file.
        what: what the table is, for messages (``"head-gate file"``).
        layout: what it holds, for messages (``"gates (layers × KV heads)"``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not text, is empty, or is not a tab-separated table of numbers.
    """
    import io

    import numpy as np

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no {what} at {path} (expected a tab-separated table of {layout})")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a tab-separated table of numbers (not text)") from None
    if not text.strip():
        raise ValueError(f"{path} is empty; expected a tab-separated table of {layout}")
    try:
        return np.loadtxt(io.StringIO(text), delimiter="\t", ndmin=2)
    except ValueError as err:
        raise ValueError(f"{path} is not a tab-separated table of numbers: {err}") from None


def write_table(path: str | Path, table, fmt: str = "%.18e") -> None:
    """Write a ``[rows, columns]`` table of numbers tab-separated (``numpy.savetxt`` with ``fmt``), atomically."""
    import numpy as np

    with atomic_path(Path(path)) as tmp:
        np.savetxt(tmp, table, fmt=fmt, delimiter="\t")


LOCK_FILE = ".elastic-bench.lock"


class FolderLockedError(ValueError):
    """Another process writes into the folder (its lock file names the holder)."""


@contextmanager
def exclusive(folder: str | Path, command: str = "", enabled: bool = True) -> Iterator[None]:
    """Hold the folder's write lock for the duration: an advisory lock (``fcntl.flock``) on the lock file
    ``.elastic-bench.lock``, which holds the holder's pid, host, command and start time and is removed on exit.
    ``enabled=False`` (the other ranks of a ``torchrun`` job, whose rank 0 holds the lock) does nothing.

    The kernel releases the lock when its holder dies, so taking a stale lock over is atomic: of any number of
    processes starting at once, one holds the lock and the others stop. A lock file left by a process of this host that
    no longer lives (a killed run) is reported on stderr and taken over; one naming a live process, or a process of
    another host (which cannot be checked), stops this process with `FolderLockedError` naming the holder, as does a
    lock held now.
    """
    if not enabled:
        yield
        return
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file, not an output folder")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    fd = _take(path)
    try:
        me = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        yield
    finally:
        if _same_file(fd, path):  # not deleted by hand and replaced by another process's lock meanwhile
            os.unlink(path)  # while still locked: a process that opened this file sees it is gone and tries again
        os.close(fd)


def _take(path: Path, patience: float = 2.0) -> int:
    """A descriptor of the lock file ``path`` holding its ``flock``; raises `FolderLockedError` when another process
    holds it (or the file names a live holder)."""
    waited = 0.0
    while True:
        try:
            fd, created = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644), True
        except FileExistsError:
            try:
                fd, created = os.open(path, os.O_RDWR), False
            except FileNotFoundError:  # released meanwhile
                continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _holder(path)
            if (holder and not _stale(holder)) or waited >= patience:
                raise FolderLockedError(_locked_message(path, holder)) from None
            time.sleep(0.05)  # the holder is writing its record over a stale one, or releasing
            waited += 0.05
            continue
        if not _same_file(fd, path):  # the holder removed this file before we locked it
            os.close(fd)
            continue
        if not created:
            holder = _record(fd)
            if holder and not _stale(holder):
                os.close(fd)
                raise FolderLockedError(_locked_message(path, holder))
            gone = "an unreadable lock" if not holder else f"the lock of pid {holder.get('pid')}, no longer running"
            print(f"elastic-bench: {path}: taking over {gone}", file=sys.stderr)
        return fd


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _record(fd: int) -> dict[str, Any] | None:
    """The holder record in the lock file open as ``fd``; None when it is empty or not a record."""
    try:
        holder = json.loads(os.pread(fd, 1 << 16, 0))
    except (ValueError, OSError):
        return None
    return holder if isinstance(holder, dict) else None


def _locked_message(path: Path, holder: dict[str, Any] | None) -> str:
    folder = path.parent
    if not holder:
        return f"{folder} is being written by another process; wait for it, or delete {path} if that process is gone"
    return (f"{folder} is being written by pid {holder.get('pid')} on {holder.get('host')} (since "
            f"{holder.get('started')}: {holder.get('command') or 'elastic-bench'}); wait for it, or delete {path} if "
            "that process is gone")


def _holder(path: Path, attempts: int = 20) -> dict[str, Any] | None:
    """The lock's holder record; ``{}`` when the lock is gone; None when it stays unreadable for a second (its holder
    writes the record within microseconds of taking the lock)."""
    for _ in range(attempts):
        try:
            holder = json.loads(path.read_text())
            return holder if isinstance(holder, dict) else None
        except FileNotFoundError:
            return {}
        except (OSError, json.JSONDecodeError):
            time.sleep(0.05)
    return None


def _stale(holder: dict[str, Any]) -> bool:
    """Whether the lock's holder ran on this host and is gone (another host's process cannot be checked: not stale)."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False
