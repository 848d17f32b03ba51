"""The floating dtypes a model, a kernel benchmark or a gate may be given by name, and the one resolution of such a
name (a config's ``dtype`` field) into a torch dtype."""

from __future__ import annotations

import torch

DTYPES = ("bfloat16", "float16", "float32")
"""The dtype names a config may give, in the order its error lists them."""


def torch_dtype(name: str | None) -> torch.dtype | None:
    """The torch dtype ``name`` gives (``"bfloat16"`` -> ``torch.bfloat16``); None for None (the loader's default).

    Raises:
        ValueError: ``name`` is not one of `DTYPES`, in one line listing them.
    """
    if name is None:
        return None
    if name not in DTYPES:
        raise ValueError(f"dtype must be {', '.join(DTYPES[:-1])} or {DTYPES[-1]}, got {name!r}")
    return getattr(torch, name)
