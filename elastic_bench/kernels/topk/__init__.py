"""Top-k block selection: InfLLM-V2, MoBA and NSA's selection branch, run training-free, as `BlockSelection` rows for
the BLOCK_SPARSE kernels.

Upstream, written from a reading of its code (none of it is copied):
- InfLLM-V2 (Zhao et al., https://arxiv.org/abs/2509.24663): OpenBMB/infllmv2_cuda_impl @ f908e73 (``max_pooling_1d``,
  the stage-1 reference ``tests/stage1/complse_online_softmax.py``) and MiniCPM4's ``modeling_minicpm.py``
  (``compressed_attention``, ``CompressK``, ``MiniCPMInfLLMv2Attention``).
- MoBA (Lu et al., https://arxiv.org/abs/2502.13189): MoonshotAI/MoBA @ 61e456b (``moba/moba_naive.py``).
- NSA (Yuan et al., https://arxiv.org/abs/2502.11089): XunhaoLai/native-sparse-attention-triton @ 9bea856
  (``ops/torch/compressed_attention.py``: ``transform_score``, ``compressed_attention_torch``).

Contract, shared by the three (`scores` states each method's scores, `rule` the selection):
- Upstream selects per query token. Here a *row* (the queries of one plan block, ``p // block_size``, positions
  absolute: bottom-right alignment) selects once, from the sum over its queries of upstream's per-token block scores
  (for MoBA, whose gate is linear in the query, the gate of the row's summed query). A row of one query is upstream's
  per-token rule; rows keep each selection to what the BLOCK_SPARSE kernels compute, and a row keeps upstream's
  budget of ``k`` blocks.
- Per row: the forced blocks (InfLLM-V2: the first ``init_blocks`` and the ``local_blocks`` before the row's own,
  that one included; NSA: the first ``init_blocks`` and the ``local_blocks`` ending with the row's own; MoBA: the
  row's own chunk), then the best-scoring blocks up to the diagonal, ties to the lower block index (upstream's
  ``torch.topk`` leaves ties unspecified), ``k`` blocks in all or every causal block when fewer. Upstream's top-k
  also ranks blocks past the row and drops them afterwards; those score at most what a causal block scores (0, or
  nothing), so the selection is the same.
- InfLLM-V2 and NSA share a row's selection across the query heads of a GQA group (their scores are summed over the
  group), MoBA selects per query head. InfLLM-V2's and NSA's key blocks are the plan's (``block_size``); MoBA's
  chunks are ``chunk_size`` tokens, a multiple of ``block_size``, each expanded to its plan blocks up to the row's.
- Keys are the call's post-RoPE keys, compressed by mean pooling (InfLLM-V2 ``CompressK``; NSA's parameter-free
  ``avgpool`` without its learned intra-block position bias, and after RoPE rather than before: there is no trained
  compression to reproduce).
- Only the KV heads marked in ``heads`` are scored; the rows of the others stay empty.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..plan import BlockSelection
from .rule import select_top_k
from .scores import infllm_v2_scores, mean_pool, moba_scores, nsa_scores

__all__ = ["infllm_v2_select", "mean_pool", "moba_select", "nsa_select", "select_top_k"]


def infllm_v2_select(q: torch.Tensor, k: torch.Tensor, *, block_size: int, kernel_size: int, kernel_stride: int,
                     topk: int, init_blocks: int, local_blocks: int, heads: torch.Tensor | None = None
                     ) -> BlockSelection:
    """InfLLM-V2's blocks (`scores.infllm_v2_scores`), ``topk`` per row and KV head, forced blocks included.

    Args:
        q: ``[B, Hq, Lq, D]`` post-RoPE queries at positions ``Lk - Lq + i``; k: ``[B, H, Lk, D]`` post-RoPE keys.
        block_size: key and query block (64 upstream); ``kernel_stride`` divides it.
        kernel_size, kernel_stride: fine compressed keys (32, 16); the coarse ones are 4× both, as upstream.
        topk: blocks per row (upstream's ``topk + window_size / block_size``).
        init_blocks, local_blocks: forced first blocks, and forced blocks before the row's own.
        heads: bool ``[B, H]``: the KV heads to select for (None: all).

    Returns:
        `BlockSelection` ``[B, Hq, ceil(Lk / block_size)]``.
    """
    score = lambda q, k: infllm_v2_scores(q, k, block_size, kernel_size, kernel_stride, init_blocks, local_blocks)
    return _select(score, q, k, heads, topk, block_size, ratio=1, shared=True)


def nsa_select(q: torch.Tensor, k: torch.Tensor, *, block_size: int, kernel_size: int, kernel_stride: int, topk: int,
               init_blocks: int, local_blocks: int, heads: torch.Tensor | None = None) -> BlockSelection:
    """NSA's selection branch (`scores.nsa_scores`), ``topk`` blocks per row and KV head, forced blocks included;
    arguments as `infllm_v2_select` (NSA's block 64, compression 32 every 16, 16 blocks, 1 initial, 2 local)."""
    score = lambda q, k: nsa_scores(q, k, block_size, kernel_size, kernel_stride, init_blocks, local_blocks)
    return _select(score, q, k, heads, topk, block_size, ratio=1, shared=True)


def moba_select(q: torch.Tensor, k: torch.Tensor, *, block_size: int, chunk_size: int, topk: int,
                heads: torch.Tensor | None = None) -> BlockSelection:
    """MoBA's chunks (`scores.moba_scores`), ``topk`` per row and query head, the row's own chunk included, as plan
    blocks of ``block_size`` (which divides ``chunk_size``); other arguments as `infllm_v2_select`."""
    score = lambda q, k: moba_scores(q, k, block_size, chunk_size)
    return _select(score, q, k, heads, topk, block_size, ratio=chunk_size // block_size, shared=False)


def _select(score: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, int]], q: torch.Tensor, k: torch.Tensor,
            heads: torch.Tensor | None, topk: int, block_size: int, ratio: int, shared: bool) -> BlockSelection:
    """Score the KV heads some sample needs, then select (`rule.select_top_k`) with every other row empty."""
    if q.dim() != 4 or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[1] % k.shape[1]:
        raise ValueError(f"expected q [B, Hq, Lq, D] and k [B, H, Lk, D]; got {tuple(q.shape)}, {tuple(k.shape)}")
    if q.shape[2] > k.shape[2]:
        raise ValueError(f"more queries ({q.shape[2]}) than keys ({k.shape[2]})")
    B, Hq = q.shape[:2]
    H, Lk = k.shape[1], k.shape[2]
    G = Hq // H
    wanted = torch.ones(B, H, dtype=torch.bool, device=q.device) if heads is None else heads.to(q.device, torch.bool)
    some = wanted.any(0)
    if bool(some.all()):
        scores, first = score(q, k)
    else:
        kv = some.nonzero()[:, 0]
        qh = (kv[:, None] * G + torch.arange(G, device=q.device)).flatten()
        part, first = score(q[:, qh], k[:, kv])
        S = H if shared else Hq
        scores = part.new_full((B, S, *part.shape[2:]), float("-inf"))
        scores[:, kv if shared else qh] = part
    rows = wanted if shared else wanted.repeat_interleave(G, dim=1)
    scores = scores.masked_fill(~rows[:, :, None, None], float("-inf"))
    return select_top_k(scores, topk, first, -(-Lk // block_size), ratio, G if shared else 1)
