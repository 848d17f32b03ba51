"""MoBA (Mixture of Block Attention) run training-free: every query head keeps its own chunk, causally, and the
past chunks whose mean key its queries score highest.

Paper: Lu et al., "MoBA: Mixture of Block Attention for Long-Context LLMs", https://arxiv.org/abs/2502.13189; upstream
MoonshotAI/MoBA (``moba/moba_naive.py``, ``moba/wrapper.py``). The selection is
`elastic_bench.kernels.topk.moba_select` (a query block selects once for its queries, upstream per token). Defaults:
upstream's ``examples/llama.py`` (``--moba-chunk-size 4096 --moba-topk 12``). Decode steps attend the whole cache, as
upstream's ``moba_layer`` does (``flash_attn_func`` over every cached key).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from elastic_bench.kernels import BlockSelection
from elastic_bench.kernels.topk import moba_select
from elastic_bench.modeling.interface import register_method

from .topk import TopKBlocks


@register_method("moba")
@dataclass
class MoBA(TopKBlocks):
    """All KV heads BLOCK_SPARSE, each query head keeping ``topk`` chunks per query block, its own chunk included
    (ΩMSR = 1).

    Args:
        chunk_size: MoBA's block of keys in tokens (4096, ``--moba-chunk-size``).
        topk: chunks per query block, the query's own included (12, ``--moba-topk``).
        block_size: query block that selects once, and the kernel's key block, in tokens; it divides ``chunk_size``
            (128, Block-Sparse-Attention's; upstream selects per token).
    """

    chunk_size: int = 4096
    topk: int = 12
    block_size: int = 128

    def __post_init__(self):
        self.check_positive(chunk_size=self.chunk_size, topk=self.topk, block_size=self.block_size)
        self.check_divides("block_size", "chunk_size")

    def select(self, query: torch.Tensor, key: torch.Tensor, heads: torch.Tensor | None = None) -> BlockSelection:
        return moba_select(query, key, block_size=self.block_size, chunk_size=self.chunk_size, topk=self.topk,
                           heads=heads)
