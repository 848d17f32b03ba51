"""Provenance recorded with every result: versions, git hash, source digest, device, date."""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import platform
import subprocess
from functools import cache, lru_cache
from pathlib import Path
from typing import Any


@cache  # the installed versions do not change while the process runs
def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def git_hash() -> str | None:
    """Commit of the elastic-bench checkout (with ``-dirty`` for local changes), or None outside a checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
        if commit.returncode:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True)
        return commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def digest(roots: list[Path]) -> str:
    """First 16 hex digits of the SHA-256 over every ``*.py`` file under ``roots`` (relative path and bytes, in
    sorted order): the same code gives the same digest wherever it is copied."""
    sha = hashlib.sha256()
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            sha.update(f"{root.name}/{path.relative_to(root).as_posix()}\0".encode())
            sha.update(path.read_bytes())
    return sha.hexdigest()[:16]


@lru_cache(maxsize=1)
def source_digest() -> str:
    """Digest of the running elastic-bench code. Unlike `git_hash` it does not depend on the checkout's history, so
    it identifies the code of a copied working tree (a remote GPU machine, a wheel) too."""
    return digest([Path(__file__).resolve().parents[1]])  # the elastic_bench package


def device_name(device=None) -> str:
    import torch

    device = torch.device(device) if device is not None else None
    if (device is None or device.type == "cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def provenance(device=None) -> dict[str, Any]:
    """Versions, git hash, source digest, device and UTC date."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_hash": git_hash(),
        "source_digest": source_digest(),
        "device": device_name(device),
        "versions": {
            name: _version(name)
            for name in ("elastic-bench", "torch", "transformers", "triton", "tokenizers")
        }
        | {"python": platform.python_version()},
    }
