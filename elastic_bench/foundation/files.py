"""Files that a reader never sees half of, and folders that one process writes at a time: the one atomic-write
helper, JSON Lines, content digests, and the output-folder lock.

An atomic write goes to a temporary file in the target's folder, is flushed to disk, then renamed over the target
(``os.replace``, atomic on POSIX): an interrupted write leaves the old file or the new one, never a torn one. A write
that the location refuses (a full disk, a quota, a read-only or forbidden folder) raises `StorageError` naming the
file, whoever writes it (safetensors' writer included). JSON Lines are read a line at a time, each line at most
`MAX_LINE_BYTES`, so a huge or hostile file is refused without being held in memory.

Part of the foundation: imports nothing of elastic-bench, so every pillar may use it.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import json
import os
import re
import socket
import stat
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
MAX_LINE_BYTES = 16 << 20
"""The longest line `read_jsonl` reads (a prediction line holds a few kB; a training record a long prompt)."""

# Errors of a location that cannot take a write (no space, over quota, a file-size limit, read-only, forbidden): the
# user's to fix.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM})
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how safetensors' writer reports an OSError


class StorageError(ValueError):
    """The location refuses a write (a full disk, a quota, a read-only or forbidden folder); what was written before
    is kept."""


@contextmanager
def storage_errors(path: str | Path) -> Iterator[None]:
    """Turn a refused write raised in the block (an `OSError` of `STORAGE_ERRNOS`, or safetensors' error carrying
    one) into a `StorageError` naming the file (``path`` where the error names none)."""
    try:
        yield
    except StorageError:
        raise
    except Exception as err:
        code = err.errno if isinstance(err, OSError) else None
        found = None if isinstance(err, OSError) else _RUST_OS_ERROR.search(str(err))
        code = int(found.group(1)) if found else code
        if code not in STORAGE_ERRNOS:
            raise
        where = getattr(err, "filename", None) or path
        reason = err.strerror if isinstance(err, OSError) and err.strerror else os.strerror(code)
        raise StorageError(f"cannot write {where}: {reason}; the results written so far are kept") from None


def stray_temporaries(path: str | Path) -> list[Path]:
    """The temporary files that atomic writes of ``path`` left behind (a writer killed before its rename), or of any
    file of the folder ``path``; only meaningful while no other process writes there."""
    path = Path(path)
    if path.is_dir():
        return sorted(p for p in path.glob(f".*{_TMP_SUFFIX}") if re.fullmatch(r"\..+\.[^.]+\.tmp", p.name))
    return sorted(path.parent.glob(f".{glob.escape(path.name)}.*{_TMP_SUFFIX}"))


def check_writable(path: str | Path) -> None:
    """Refuse, before any work, to write the file ``path`` where its location refuses a new file (a read-only or
    forbidden folder, a full disk): a temporary file is created in its folder, or in the nearest folder above it that
    exists, and removed at once; nothing else is created.

    Raises:
        StorageError: naming the folder and the reason.
    """
    folder = Path(path).parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    with storage_errors(folder):
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".elastic-bench-probe.", suffix=_TMP_SUFFIX)
        os.close(fd)
        os.unlink(probe)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; when the block ends without error, it replaces ``path``.

    For writers that take a file name (``safetensors.torch.save_file``, ``numpy.savetxt``)::

        with atomic_path(out / "router.safetensors") as tmp:
            save_file(tensors, str(tmp))
    """
    path = Path(path)
    tmp = None
    try:
        with storage_errors(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TMP_SUFFIX)
            os.close(fd)
            yield Path(tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes the file private; a result file has the usual mode
            os.replace(tmp, path)
    finally:
        if tmp is not None and os.path.exists(tmp):
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
    with storage_errors(path), open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


class LineTooLongError(ValueError):
    """A line of a file is longer than its reader's bound (``number``: the line's, from 1)."""

    def __init__(self, path: str | Path, number: int, limit: int):
        super().__init__(f"line {number} of {path} is longer than {limit:,} bytes")
        self.number = number


def read_lines(path: str | Path, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes, bool]]:
    """``(number, line, ended)`` for each line of the file ``path`` (numbered from 1, without its newline; ``ended``:
    a newline follows it, which the last line of an interrupted append lacks), read a line at a time.

    Raises:
        LineTooLongError: a line is longer than ``limit`` bytes (nothing more of it is read).
    """
    with open(path, "rb") as f:
        for number, line in enumerate(iter(lambda: f.readline(limit + 1), b""), 1):
            ended = line.endswith(b"\n")
            content = line[:-1] if ended else line
            if len(content) > limit:
                raise LineTooLongError(path, number, limit)
            yield number, content, ended


def parse_json(text: str | bytes) -> Any:
    """``json.loads(text)``; ValueError for text that is not JSON, nested too deeply for the parser included."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def read_jsonl(path: str | Path, limit: int = MAX_LINE_BYTES) -> list[dict[str, Any]]:
    """The records of a JSON Lines file ([] when it does not exist), up to the first line that is not JSON; a torn last
    line (an interrupted append) is dropped.

    Raises:
        LineTooLongError: a line is longer than ``limit`` bytes (`read_lines`).
    """
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for _, line, _ in read_lines(path, limit):
        try:
            records.append(parse_json(line))
        except ValueError:
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
    ``enabled=False`` (the other ranks of a ``torchrun`` job, whose rank 0 holds the lock) does nothing. Every
    command that writes into a folder of its own (``run``, ``train-router``, ``train-duo``, ``train-prulong``,
    ``testbed train``) takes it here.

    The kernel releases the lock when its holder dies, so taking a stale lock over is atomic: of any number of
    processes starting at once, one holds the lock and the others stop. A lock file left by a process of this host that
    no longer lives (a killed run) is reported on stderr and taken over; one naming a live process, or a process of
    another host (which cannot be checked), stops this process with `FolderLockedError` naming the holder, as does a
    lock held now. The lock file is never opened through a symbolic link (``O_NOFOLLOW``), which could lead out of the
    folder: a link, dangling or not, or anything but a regular file in its place is refused at once.

    Raises:
        FolderLockedError: another process holds the folder.
        ValueError: ``folder`` is a file, or its lock file is a symbolic link or not a regular file.
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


LOCK_TRIES = 400
LOCK_PAUSE = 0.01  # seconds between two tries at a lock file that another process creates or removes meanwhile


def _take(path: Path, patience: float = 2.0) -> int:
    """A descriptor of the lock file ``path`` holding its ``flock``; raises `FolderLockedError` when another process
    holds it (or the file names a live holder), or when `LOCK_TRIES` tries, `LOCK_PAUSE` apart, found the file
    replaced each time."""
    waited = 0.0
    for attempt in range(LOCK_TRIES):
        if attempt:
            time.sleep(LOCK_PAUSE)
        opened = _open_lock(path)
        if opened is None:  # released meanwhile
            continue
        fd, created = opened
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _holder(path)
            if (holder and not _stale(holder)) or waited >= patience:
                raise FolderLockedError(_locked_message(path, holder)) from None
            waited += LOCK_PAUSE  # the holder is writing its record over a stale one, or releasing
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
    raise FolderLockedError(f"{path} was replaced {LOCK_TRIES} times while elastic-bench tried to take it; another "
                            f"process keeps creating and removing it: wait for it, or use another folder")


_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # non-blocking: a FIFO put there cannot hang


def _open_lock(path: Path) -> tuple[int, bool] | None:
    """``(descriptor, created)`` of the lock file ``path``, opened or created without following a link; None when it
    vanished between the two tries.

    Raises:
        ValueError: ``path`` is a symbolic link or not a regular file.
    """
    try:
        fd, created = os.open(path, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, 0o644), True
    except FileExistsError:
        try:
            fd, created = os.open(path, _OPEN_FLAGS), False
        except FileNotFoundError:
            return None
        except OSError as err:
            if err.errno != errno.ELOOP:
                raise
            raise ValueError(f"{path} is a symbolic link; elastic-bench takes no lock through a link, which may lead "
                             "out of the folder: delete the link (nothing was written)") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"{path} is not a regular file; delete it (nothing was written)")
    return fd, created


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.lstat(path))
    except FileNotFoundError:
        return False


def _record(fd: int) -> dict[str, Any] | None:
    """The holder record in the lock file open as ``fd``; None when it is empty or not a record."""
    try:
        holder = parse_json(os.pread(fd, 1 << 16, 0))
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
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return {}
        except OSError:
            return None
        try:
            holder = _record(fd)
        finally:
            os.close(fd)
        if holder is not None:
            return holder
        time.sleep(0.05)
    return None


def _stale(holder: dict[str, Any]) -> bool:
    """Whether the lock's holder ran on this host and is gone (another host's process cannot be checked: not stale)."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    return not alive(holder["pid"])


def alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (another user's included)."""
    if pid <= 0:  # signal 0 would reach a process group, not a process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    except (OverflowError, ValueError):  # no such pid can exist
        return False
    return True
