"""Hybrid-head attention kernels: FULL, STREAMING and BLOCK_SPARSE heads of one layer in one call.

Knows nothing of models. Public API: `HeadPlan` (what to compute), `hybrid_attention` (compute it), `pair_counts`
(how much it computes).
"""

from . import adapters, flex, triton_hybrid
from .hybrid import available_backends, backend_names, hybrid_attention, register_backend, resolve_backend
from .plan import BlockSelection, HeadPlan, Mode, StreamingGeometry
from .sparsity import PairCounts, causal_pairs, pair_counts
from .xattention import xattention_select

# GPU backends, fastest first (priorities from the H200 measurements in docs/benchmarks.md, "Kernels").
register_backend("split", triton_hybrid.split_hybrid_attention, available=triton_hybrid.available, priority=30,
                 prefer=triton_hybrid.split_pays_off)
register_backend("triton", triton_hybrid.triton_hybrid_attention, available=triton_hybrid.available, priority=20)
register_backend("flex", flex.flex_hybrid_attention, available=flex.available, priority=10)
register_backend("block_sparse_attn", adapters.block_sparse_attn, available=adapters.block_sparse_attn_available,
                 priority=5)
register_backend("flash_attn", adapters.flash_attn, available=adapters.flash_attn_available, priority=4)

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
    "xattention_select",
]
