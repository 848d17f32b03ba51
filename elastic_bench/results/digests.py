"""What a cell's fingerprint knows its inputs by: content digests of files, cached, and the commits of hub repositories.

Design decisions:
- A file is known by the SHA-256 of its bytes (`elastic_bench.foundation.files.digest`). Large files (a model's
  weights, a corpus) are read once per content: the digest is cached in a small JSON file (`cache_path`) under the
  file's resolved path, size, modification and change times and inode, so that any write to the file (which changes
  its change time, which no user can set) reads it again. A cache that cannot be read or written is ignored.
- A set of files (a model folder's weights, configuration and tokenizer) is known by one SHA-256 over each file's
  name relative to its folder and its digest: the same files give the same digest wherever the folder lies.
- A learned file that a method loads (a router, gates) is read once: the run puts what the method loads from it into
  a private folder (`held_folder`; `copy_artifact` by default, `Method.hold`), digests that and has the method load
  it, so the bytes a cell is known by are the bytes it ran with, whatever happens to the original meanwhile. The
  folder is named after its process and host, so the folders that killed runs left are found and removed.
- A hub repository is known by the commit its ``main`` resolves to: asked of the hub when it answers, else read from
  the local Hugging Face cache (what an offline load uses).

No torch.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from elastic_bench.foundation.files import alive, digest, write_json

CACHE_VAR = "ELASTIC_BENCH_CACHE"


def cache_path() -> Path:
    """The digest cache: ``$ELASTIC_BENCH_CACHE/digests.json``, else ``$XDG_CACHE_HOME/elastic-bench/digests.json``,
    else ``~/.cache/elastic-bench/digests.json``."""
    folder = os.environ.get(CACHE_VAR) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / \
        "elastic-bench"
    return Path(folder) / "digests.json"


def _stamp(path: Path) -> list[int]:
    info = path.stat()
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]


def cached_digest(path: str | Path) -> str:
    """SHA-256 (hex) of the file ``path``'s bytes, read only when the cache holds none for its current size, times and
    inode (module header).

    Raises:
        OSError: the file cannot be read.
    """
    path = Path(path).resolve()
    stamp = _stamp(path)
    cache = cache_path()
    try:
        entries = json.loads(cache.read_text())
        entries = entries if isinstance(entries, dict) else {}
    except (OSError, ValueError):
        entries = {}
    entry = entries.get(str(path))
    if isinstance(entry, dict) and entry.get("stamp") == stamp and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    sha = digest(path)
    if _stamp(path) == stamp:  # not written while it was read: worth keeping
        try:
            write_json(cache, {**entries, str(path): {"stamp": stamp, "sha256": sha}})
        except OSError:
            pass
    return sha


def files_digest(folder: str | Path, files: list[Path]) -> str:
    """SHA-256 (hex) over ``files`` (paths under ``folder``), each as its path relative to ``folder`` and its
    `cached_digest`, in sorted order."""
    sha = hashlib.sha256()
    for file in sorted(files):
        sha.update(f"{Path(file).relative_to(folder).as_posix()}\0{cached_digest(file)}\n".encode())
    return sha.hexdigest()


def copy_artifact(path: str | Path, folder: str | Path) -> Path:
    """Copy the file or folder ``path`` into ``folder`` (a private folder that nothing else writes) and return the
    copy, under the same name. Symbolic links inside a folder are copied as the files they name.

    Raises:
        OSError: ``path`` cannot be read.
    """
    path = Path(path)
    copy = Path(folder) / path.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        shutil.copytree(path, copy, symlinks=False)
    else:
        shutil.copyfile(path, copy)
    return copy


HELD_PREFIX = "elastic-bench-held-"


@contextmanager
def held_folder() -> Iterator[Path]:
    """A private folder for a run's copies of its learned files, in the temporary directory (``$TMPDIR``), removed
    when the block ends: ``elastic-bench-held-<pid>-<host>.<random>``. The folders that runs of this host and user
    left when they were killed (their process is gone) are removed first, with a line on stderr."""
    root, host = Path(tempfile.gettempdir()), socket.gethostname()
    for stale in sorted(root.glob(f"{HELD_PREFIX}*")):
        found = re.fullmatch(rf"{HELD_PREFIX}(\d+)-(.*)\.[^.]+", stale.name)
        if (found and found.group(2) == host and stale.is_dir() and not stale.is_symlink()
                and stale.stat().st_uid == os.getuid() and not alive(int(found.group(1)))):
            shutil.rmtree(stale, ignore_errors=True)
            print(f"elastic-bench: removed {stale}, the learned files held by a run that was killed", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix=f"{HELD_PREFIX}{os.getpid()}-{host}.") as folder:
        yield Path(folder)


HUB_TIMEOUT = 5.0  # seconds the hub has to answer before it is taken to be unreachable for the process


def hub_unavailable() -> str | None:
    """Why the Hugging Face hub cannot be used now, in a few words: ``HF_HUB_OFFLINE`` is set, or its endpoint did not
    answer one request within `HUB_TIMEOUT` seconds (asked once per process); None when it answers. A caller then
    reads the local cache only, instead of letting huggingface_hub retry the network for a minute."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        return "HF_HUB_OFFLINE is set"
    return _hub_unreachable(constants.ENDPOINT)


@functools.lru_cache(maxsize=1)
def _hub_unreachable(endpoint: str) -> str | None:
    """Why the hub at ``endpoint`` does not answer within `HUB_TIMEOUT` seconds (one request), or None when it does."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(endpoint, timeout=HUB_TIMEOUT)
    except Exception as err:  # noqa: BLE001  (no network, DNS, proxy, TLS: all mean "unreachable")
        return f"{endpoint} did not answer: {type(err).__name__}"
    return None


def hub_revision(repo_id: str, repo_type: str, online: bool, timeout: float = 5.0) -> str | None:
    """The commit that ``main`` of the hub repository ``repo_id`` (``repo_type``: ``model`` or ``dataset``) resolves
    to: the hub's answer when ``online`` and it answers within ``timeout`` seconds, else the local Hugging Face cache's
    record; None when neither knows it."""
    from huggingface_hub import HfApi, constants

    if online:
        try:
            return HfApi().repo_info(repo_id, repo_type=repo_type, timeout=timeout).sha
        except Exception:  # noqa: BLE001  (no network, gated, removed: the cache's record is what a load would use)
            pass
    ref = Path(constants.HF_HUB_CACHE) / f"{repo_type}s--{repo_id.replace('/', '--')}" / "refs" / "main"
    try:
        return ref.read_text().strip() or None
    except OSError:
        return None
