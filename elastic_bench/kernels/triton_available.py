"""Whether Triton can run a kernel on a device: the one test that the hybrid prefill, decode and XAttention backends
share."""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_available(device: torch.device) -> bool:
    """Triton on a CUDA device, or on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``: the tests)."""
    if not _triton_installed():
        return False
    if device.type == "cuda":
        return torch.cuda.is_available()
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") == "1"
