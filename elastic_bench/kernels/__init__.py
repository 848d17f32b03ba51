"""Hybrid-head attention kernels: FULL, STREAMING and BLOCK_SPARSE heads of one layer in one call.

Knows nothing of models. `HeadPlan` says what to compute, `hybrid_attention` computes it (`hybrid/`: the naive
reference beside the masked CPU path and the fused Triton, FlexAttention and external-package backends),
`xattention_select` chooses XAttention's blocks (`xattention/`: naive reference beside the fused and GEMM
implementations), `topk/` those of the top-k block methods (InfLLM-V2, MoBA, NSA), and `sparsity` counts what a plan
computes (ΩMSR, ΩESR).
"""

from .dtypes import DTYPES, torch_dtype
from .hybrid import available_backends, backend_names, hybrid_attention, register_backend, resolve_backend
from .plan import BlockSelection, HeadPlan, Mode, StreamingGeometry
from .sparsity import STATISTICS, PairCounts, SparsityMeter, causal_pairs, pair_counts, sample_means
from .xattention import xattention_select

__all__ = [
    "DTYPES",
    "STATISTICS",
    "BlockSelection",
    "HeadPlan",
    "Mode",
    "PairCounts",
    "SparsityMeter",
    "StreamingGeometry",
    "available_backends",
    "backend_names",
    "causal_pairs",
    "hybrid_attention",
    "pair_counts",
    "register_backend",
    "resolve_backend",
    "sample_means",
    "torch_dtype",
    "xattention_select",
]
