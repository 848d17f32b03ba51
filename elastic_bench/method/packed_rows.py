"""A packed training row attended in one call: what every routed layer of the row's forward shares.

The trainer packs several samples into one row (``cu_seq_lens``). Planned and attended one sample at a time, each
layer costs the row's samples times the launches of a router, a relaxation and two attention branches, which for a
small model is most of a training step. `RowLayout` holds instead, once per row, which sample each token belongs to,
which keys each sample's router pools, and the two branches' FlexAttention masks (causal within each sample;
streaming counted from each sample's start), so that a layer pools, routes and attends the whole row in a few calls
(`elastic_bench.method.elastic.Elastic.attend_row`). It computes what the per-sample path computes, up to the order of
floating-point sums.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from elastic_bench.kernels import StreamingGeometry


@dataclass
class RowLayout:
    """One padded row of N samples.

    Attributes:
        doc: ``[T']`` long: the sample of each token (``N`` for the padding after the last sample).
        pool_index: ``[M]`` long: the positions of the keys the routers pool, sample after sample.
        pool_sample: ``[M]`` long: the sample of each of them.
        pool_weight: ``[M]`` float32: the weight of each in its sample's pooled key.
        full_mask, sparse_mask: FlexAttention block masks of the FULL and the STREAMING branch.
    """

    doc: torch.Tensor
    pool_index: torch.Tensor
    pool_sample: torch.Tensor
    pool_weight: torch.Tensor
    full_mask: Any
    sparse_mask: Any

    @classmethod
    def of(cls, bounds: list[int], prompt_lens: list[int], length: int, weights, geometry: StreamingGeometry,
           block_size: int, device, with_grad: bool) -> RowLayout:
        """The layout of a row with sample ``bounds [N + 1]`` (host ints), ``prompt_lens [N]``, padded to ``length``
        tokens; ``weights(prompt_len) -> (first, last, weight)`` says which keys a router pools
        (`elastic_bench.method.router.AttentionRouter.pool_weights`)."""
        from elastic_bench.kernels.hybrid.flex import document_block_mask

        index, sample, weight = [], [], []
        for i, (start, prompt) in enumerate(zip(bounds[:-1], prompt_lens)):
            first, last, w = weights(prompt)
            for lo, hi in ((start, start + first), (start + prompt - last, start + prompt)):
                if hi > lo:
                    index.append(torch.arange(lo, hi, device=device))
                    sample.append(torch.full((hi - lo,), i, device=device))
                    weight.append(torch.full((hi - lo,), w, device=device))
        edges = torch.tensor([*bounds[1:], length], device=device)
        doc = torch.searchsorted(edges, torch.arange(length, device=device), right=True)
        return cls(doc, torch.cat(index), torch.cat(sample), torch.cat(weight),
                   document_block_mask(bounds, length, None, block_size, device, with_grad),
                   document_block_mask(bounds, length, geometry, block_size, device, with_grad))

    def pooled(self, keys: torch.Tensor, samples: int) -> torch.Tensor:
        """Pre-RoPE keys ``[1, H, T, D]`` of the row → each sample's pooled key ``[N, H, D]`` (float32)."""
        picked = keys[0][:, self.pool_index].float() * self.pool_weight[None, :, None]  # [H, M, D]
        out = picked.new_zeros(samples, keys.shape[1], keys.shape[3])
        return out.index_add_(0, self.pool_sample, picked.transpose(0, 1))

    def per_token(self, decisions: torch.Tensor, group: int) -> torch.Tensor:
        """Decisions ``r [N, H]`` → the mixing weight of every query head and token, ``[1, H·group, T', 1]`` (0 for
        the padding)."""
        padded = torch.cat([decisions, decisions.new_zeros(1, decisions.shape[1])])
        return padded[self.doc].t().repeat_interleave(group, dim=0)[None, :, :, None]
