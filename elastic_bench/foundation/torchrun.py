"""``torchrun``'s environment, read and checked once: this process's rank, the world size and the local rank.

Outside ``torchrun`` (``WORLD_SIZE`` unset or 1) a process is rank 0 of 1. A value that ``torchrun`` would never set
(a world size that is not a whole number, ``WORLD_SIZE`` without ``RANK``, a rank outside the world) is a user's
error: one ValueError naming the variable, before anything joins a process group or loads a model.

Part of the foundation: imports nothing of elastic-bench, so every pillar may use it.
"""

from __future__ import annotations

import os


def torchrun_env() -> tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` from ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; ``(0, 1, 0)`` outside
    ``torchrun``.

    Raises:
        ValueError: a variable that is not a whole number in its range, or ``WORLD_SIZE`` above 1 without ``RANK``.
    """
    world = _whole("WORLD_SIZE", 1, None, default=1)
    if world == 1:
        return 0, 1, 0
    if "RANK" not in os.environ:
        raise ValueError(f"WORLD_SIZE is {world} but RANK is not set: start the processes with torchrun (which sets "
                         "both), or unset WORLD_SIZE to run one process")
    return _whole("RANK", 0, world - 1), world, _whole("LOCAL_RANK", 0, None, default=0)


def _whole(name: str, low: int, high: int | None, default: int | None = None) -> int:
    text = os.environ.get(name)
    if text is None and default is not None:
        return default
    value = int(text.strip()) if text is not None and text.strip().isdigit() else None
    if value is None or value < low or (high is not None and value > high):
        where = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be a whole number {where} (torchrun sets it), got {text!r}")
    return value
