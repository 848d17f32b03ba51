"""XAttention: training-free block-sparse prefill, every head keeping the key blocks its antidiagonal scores select.

Paper: Xu et al., "XAttention: Block Sparse Attention with Antidiagonal Scoring", ICML 2025,
https://arxiv.org/abs/2503.16428, and upstream mit-han-lab/x-attention (``xattn/src/Xattention.py``). The estimation
and selection live in `elastic_bench.kernels.xattention`. Selection is per *query* head and per prompt; a flat τ for
every head (upstream's per-head threshold tables carry no licence and are not shipped). Decode steps attend the whole
cache, as upstream.
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic_bench.interface import AttentionCall, Method, register_method
from elastic_bench.kernels import HeadPlan, Mode, xattention_select


@register_method("xattention", "xattn")
@dataclass
class XAttention(Method):
    """All KV heads BLOCK_SPARSE with blocks chosen by XAttention's antidiagonal scores (ΩMSR = 1).

    Args:
        threshold: cumulative-mass threshold τ (0.9 as the Elastic paper; upstream's eval model uses 0.8).
        stride: antidiagonal stride S (16 as Elastic; 8 in some upstream settings).
        block_size: block size (128, as Block-Sparse-Attention).
    """

    threshold: float = 0.9
    stride: int = 16
    block_size: int = 128

    def __post_init__(self):
        if not 0.0 <= self.threshold <= 1.0:  # NaN fails too
            raise ValueError(f"{self.name}.threshold must lie in [0, 1], got {self.threshold}")
        if self.stride < 1:
            raise ValueError(f"{self.name}.stride must be >= 1, got {self.stride}")
        if self.block_size < 1:
            raise ValueError(f"{self.name}.block_size must be >= 1, got {self.block_size}")
        if self.block_size % self.stride:
            raise ValueError(f"{self.name}.stride must divide {self.name}.block_size ({self.block_size}), "
                             f"got {self.stride}")

    def prefill_plan(self, call: AttentionCall) -> HeadPlan:
        blocks = xattention_select(call.query, call.key, self.threshold, self.stride, self.block_size)
        return HeadPlan.uniform(
            Mode.BLOCK_SPARSE, call.batch_size, call.num_kv_heads, blocks=blocks,  # host modes: no sync
            block_size=self.block_size,
        )
