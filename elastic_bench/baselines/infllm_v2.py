"""InfLLM-V2 run training-free: every KV head keeps the key blocks its query block selects from compressed keys.

Paper: Zhao et al., "InfLLM-V2: Dense-Sparse Switchable Attention for Seamless Short-to-Long Adaptation",
https://arxiv.org/abs/2509.24663; upstream OpenBMB/infllmv2_cuda_impl and MiniCPM4's ``modeling_minicpm.py``
(``MiniCPMInfLLMv2Attention``). The selection is `elastic_bench.kernels.topk.infllm_v2_select` (its contract: a query
block selects once for its queries, upstream per token). The defaults are MiniCPM4's ``sparse_config``, as
``MiniCPMInfLLMv2Attention.__init__`` reads it: block 64, compression 32 every 16, ``topk`` 64 blocks plus the
``window_size`` / ``block_size`` = 32 window blocks, 1 initial block, dense below 8192 keys.

Decode steps attend the whole cache. Upstream selects blocks at decode too (``compressed_attention`` with the cache
lengths, over compressed keys it extends token by token); the packed decode cache keeps whole rows and its kernel
attends a row's every slot, so no decode-time selection fits it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from elastic_bench.kernels import BlockSelection, HeadPlan
from elastic_bench.kernels.topk import infllm_v2_select
from elastic_bench.modeling.interface import AttentionCall, register_method

from .topk import CompressedKeyBlocks


@register_method("infllm_v2")
@dataclass
class InfLLMv2(CompressedKeyBlocks):
    """All KV heads BLOCK_SPARSE with InfLLM-V2's top-k blocks, shared by a GQA group (ΩMSR = 1 from ``dense_len``
    keys on; every head FULL below).

    Args:
        block_size: key and query block in tokens (64, MiniCPM4 ``sparse_config.block_size``).
        kernel_size: tokens per fine compressed key (32, ``kernel_size``); the coarse keys that normalise the scores
            take 4× as many (``CompressK`` ``compress_k2``).
        kernel_stride: stride of the fine compressed keys (16, ``kernel_stride``; 4× for the coarse ones).
        topk: selected blocks per query block beyond the window's, at least ``init_blocks + 1`` (64, ``topk``).
        window_size: local window in tokens, ``window_size / block_size`` forced blocks before the query's own, which
            are added to ``topk`` (2048, ``window_size``).
        init_blocks: forced initial blocks (1, ``init_blocks``).
        dense_len: prompts of fewer keys attend densely (8192, ``dense_len``; 0: always sparse).
    """

    topk: int = 64
    window_size: int = 2048
    init_blocks: int = 1
    dense_len: int = 8192

    def __post_init__(self):
        super().__post_init__()
        self.check_positive(topk=self.topk)
        if self.window_size < 0 or self.init_blocks < 0 or self.dense_len < 0:
            raise ValueError(f"{self.name}.window_size, init_blocks and dense_len must be >= 0, got "
                             f"{self.window_size}, {self.init_blocks}, {self.dense_len}")
        self.check_budget(self.topk + self.local_blocks, self.init_blocks + self.local_blocks + 1)

    @property
    def local_blocks(self) -> int:
        return self.window_size // self.block_size

    def select(self, query: torch.Tensor, key: torch.Tensor, heads: torch.Tensor | None = None) -> BlockSelection:
        return infllm_v2_select(query, key, block_size=self.block_size, kernel_size=self.kernel_size,
                                kernel_stride=self.kernel_stride, topk=self.topk + self.local_blocks,
                                init_blocks=self.init_blocks, local_blocks=self.local_blocks, heads=heads)

    def prefill_plan(self, call: AttentionCall) -> HeadPlan:
        if call.key.shape[2] < self.dense_len:
            return HeadPlan.full(call.batch_size, call.num_kv_heads)
        return super().prefill_plan(call)
