"""Provenance recorded with every result: versions, git hash, device, date."""

from __future__ import annotations

import datetime
import importlib.metadata
import platform
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def git_hash() -> str | None:
    """Commit of the elastic-bench checkout (with ``-dirty`` for local changes), or None outside a checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
        if commit.returncode:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True)
        return commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def device_name(device=None) -> str:
    import torch

    device = torch.device(device) if device is not None else None
    if (device is None or device.type == "cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def provenance(device=None) -> dict[str, Any]:
    """Versions, git hash, device and UTC date."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_hash": git_hash(),
        "device": device_name(device),
        "versions": {
            name: _version(name)
            for name in ("elastic-bench", "torch", "transformers", "triton", "tokenizers")
        }
        | {"python": platform.python_version()},
    }
