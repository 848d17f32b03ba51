"""What the top-k block methods (``infllm_v2``, ``moba``, ``nsa``) share: every KV head BLOCK_SPARSE, with the key
blocks each query block selects by its upstream's scores (`elastic_bench.kernels.topk`), and dense decode steps.

A top-k block method is also the block-sparse side Elastic Attention can take instead of XAttention
(`elastic_bench.method.modes`): `TopKBlocks.select` is what both call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from elastic_bench.kernels import BlockSelection, HeadPlan, Mode
from elastic_bench.modeling.interface import AttentionCall, Method


@dataclass
class TopKBlocks(Method):
    """Base of the top-k block methods; a subclass has a ``block_size`` knob (its plan's blocks) and `select`."""

    def select(self, query: torch.Tensor, key: torch.Tensor, heads: torch.Tensor | None = None) -> BlockSelection:
        """The blocks of ``query [B, Hq, Lq, D]`` over ``key [B, H, Lk, D]`` (post-RoPE), rows ``[B, Hq,
        ceil(Lk / block_size)]``, for the KV heads marked in ``heads`` (bool ``[B, H]``; None: all)."""
        raise NotImplementedError

    def prefill_plan(self, call: AttentionCall) -> HeadPlan:
        return HeadPlan.uniform(Mode.BLOCK_SPARSE, call.batch_size, call.num_kv_heads,  # host modes: no sync
                                blocks=self.select(call.query, call.key), block_size=self.block_size)

    def check_positive(self, **knobs: int) -> None:
        """Refuse a knob below 1, naming it."""
        for knob, value in knobs.items():
            if value < 1:
                raise ValueError(f"{self.name}.{knob} must be >= 1, got {value}")

    def check_budget(self, topk: int, forced: int) -> None:
        """Refuse a budget of ``topk`` blocks per query block that cannot hold the ``forced`` ones."""
        if topk < forced:
            raise ValueError(f"{self.name}: {topk} blocks per query block cannot hold the {forced} forced ones "
                             "(initial and local blocks)")

    def check_divides(self, small: str, large: str) -> None:
        """Refuse knob ``small`` not dividing knob ``large``."""
        if getattr(self, large) % getattr(self, small):
            raise ValueError(f"{self.name}.{small} ({getattr(self, small)}) must divide {self.name}.{large} "
                             f"({getattr(self, large)})")


@dataclass
class CompressedKeyBlocks(TopKBlocks):
    """Base of the methods that score 64-token blocks against mean-pooled keys (InfLLM-V2, NSA), which share these
    knobs and their upstream values.

    Args:
        block_size: key and query block in tokens.
        kernel_size: tokens per compressed key; ``kernel_stride`` divides it.
        kernel_stride: stride of the compressed keys; it divides ``block_size``.
    """

    block_size: int = 64
    kernel_size: int = 32
    kernel_stride: int = 16

    def __post_init__(self):
        self.check_positive(block_size=self.block_size, kernel_size=self.kernel_size, kernel_stride=self.kernel_stride)
        self.check_divides("kernel_stride", "block_size")
        self.check_divides("kernel_stride", "kernel_size")
