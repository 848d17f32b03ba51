"""Hybrid-head attention kernels: FULL, STREAMING and BLOCK_SPARSE heads of one layer in one call.

Knows nothing of models. Public API: `HeadPlan` (what to compute), `hybrid_attention` (compute it), `pair_counts`
(how much it computes).
"""

from .hybrid import available_backends, backend_names, hybrid_attention, register_backend, resolve_backend
from .plan import BlockSelection, HeadPlan, Mode, StreamingGeometry
from .sparsity import PairCounts, causal_pairs, pair_counts

__all__ = [
    "BlockSelection",
    "HeadPlan",
    "Mode",
    "PairCounts",
    "StreamingGeometry",
    "available_backends",
    "backend_names",
    "causal_pairs",
    "hybrid_attention",
    "pair_counts",
    "register_backend",
    "resolve_backend",
]
