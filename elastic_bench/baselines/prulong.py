"""PruLong ("Cache Me If You Can", https://arxiv.org/abs/2506.17121): a learned (L0-gated) mask per KV head in
DuoAttention's gate layout; streaming heads keep sink 128 + window 1024.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from elastic_bench.interface import register_method

from .gates import HeadGates


@register_method("prulong")
@dataclass
class PruLong(HeadGates):
    """PruLong: a learned (L0-gated) gate file in DuoAttention's layout; streaming sink 128 + window 1024.

    No PruLong masks are released upstream: ``pattern`` must be given, or the model directory must ship a
    ``head_gates.tsv`` (0/1 masks: ``sparsity=None``).
    """

    sparsity: float | None = None
    sink: int = 128
    local: int = 1024

    duo_patterns: ClassVar[bool] = False
