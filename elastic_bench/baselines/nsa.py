"""NSA's selection branch run training-free: every KV head keeps the key blocks its query block selects from the
probabilities of its queries over compressed keys.

Paper: Yuan et al., "Native Sparse Attention: Hardware-Aligned and Natively Trainable Sparse Attention",
https://arxiv.org/abs/2502.11089; upstream XunhaoLai/native-sparse-attention-triton (``compressed_attention``,
``NativeSparseAttention``). The selection is `elastic_bench.kernels.topk.nsa_select` (a query block selects once for
its queries, upstream per token; parameter-free mean-pooled keys). Defaults: upstream's README
(``compressed_attention(..., kernel_size=32, kernel_stride=16, block_size=64, topk=16, init_blocks=1,
local_blocks=2)``), the paper's l = 32, d = 16, l' = 64, n = 16.

Only the selection branch runs, its output the attention. NSA's compression branch (attention over learned compressed
keys and values) and sliding-window branch enter the output through gates an MLP learns (``gate = sigmoid(W x)``);
without trained gates and compression weights neither has an output to give, so both are left out. Decode steps
attend the whole cache (upstream selects at decode too, which the packed decode cache does not hold).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from elastic_bench.kernels import BlockSelection
from elastic_bench.kernels.topk import nsa_select
from elastic_bench.modeling.interface import register_method

from .topk import CompressedKeyBlocks


@register_method("nsa")
@dataclass
class NSA(CompressedKeyBlocks):
    """All KV heads BLOCK_SPARSE with NSA's selected blocks, shared by a GQA group (ΩMSR = 1).

    Args:
        block_size: key and query block in tokens (64, ``block_size``).
        kernel_size: tokens per compressed key (32, ``kernel_size``); ``kernel_stride`` divides it.
        kernel_stride: stride of the compressed keys (16, ``kernel_stride``); it divides ``block_size``.
        topk: blocks per query block, the forced ones included (16, ``topk``).
        init_blocks: forced initial blocks (1, ``init_blocks``).
        local_blocks: forced blocks ending with the query's own (2, ``local_blocks``); at least 1.
    """

    topk: int = 16
    init_blocks: int = 1
    local_blocks: int = 2

    def __post_init__(self):
        super().__post_init__()
        self.check_positive(topk=self.topk, local_blocks=self.local_blocks)
        if self.init_blocks < 0:
            raise ValueError(f"{self.name}.init_blocks must be >= 0, got {self.init_blocks}")
        self.check_budget(self.topk, self.init_blocks + self.local_blocks)

    def select(self, query: torch.Tensor, key: torch.Tensor, heads: torch.Tensor | None = None) -> BlockSelection:
        return nsa_select(query, key, block_size=self.block_size, kernel_size=self.kernel_size,
                          kernel_stride=self.kernel_stride, topk=self.topk, init_blocks=self.init_blocks,
                          local_blocks=self.local_blocks, heads=heads)
