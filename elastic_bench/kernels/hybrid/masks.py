"""Token-level mask predicates, one per HeadPlan mode (the `mask_mod` twins of attention-gym).

Each factory returns ``mask(q_pos, kv_pos) -> bool`` over broadcastable integer tensors of *absolute* positions
(``q_pos = Lk - Lq + i``). True means the pair is computed. The reference kernel evaluates these directly, the masked
backend inside the key blocks it gathers; the FlexAttention backend wraps them into ``mask_mod(b, h, q_idx, kv_idx)``;
tests compare every kernel against them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..plan import Mode, StreamingGeometry

MaskFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def causal() -> MaskFn:
    """Dense causal: ``kv <= q``."""

    def mask(q, kv):
        return kv <= q

    mask.__name__ = "causal"
    return mask


def streaming(geometry: StreamingGeometry, block_size: int = 128) -> MaskFn:
    """Sink + local window (``(causal & window) | (causal & sink)``): token- or block-granular, or chunked-prefill
    (`StreamingGeometry` states each rule)."""
    sink_end = geometry.sink_end(block_size)

    def mask(q, kv):
        return (kv <= q) & ((kv < sink_end) | (kv >= geometry.window_start(q, block_size)))

    kind = "chunked" if geometry.chunk_starts else geometry.granularity
    mask.__name__ = f"streaming_{kind}_{geometry.sink}_{geometry.local}"
    return mask


def block_sparse(table: torch.Tensor, block_size: int = 128) -> MaskFn:
    """Selected blocks of ``table [nQ, nK]`` (bool, absolute block rows), causal inside diagonal blocks."""

    def mask(q, kv):
        return (kv <= q) & table[q // block_size, kv // block_size]

    mask.__name__ = "block_sparse"
    return mask


def for_mode(mode: Mode, geometry: StreamingGeometry, block_size: int, table: torch.Tensor | None = None) -> MaskFn:
    """The predicate of one head; ``table`` is that query head's dense block mask for BLOCK_SPARSE."""
    if mode == Mode.FULL:
        return causal()
    if mode == Mode.STREAMING:
        return streaming(geometry, block_size)
    if mode == Mode.BLOCK_SPARSE:
        if table is None:
            raise ValueError("BLOCK_SPARSE needs a block table")
        return block_sparse(table, block_size)
    raise ValueError(f"unknown mode {mode!r}")
