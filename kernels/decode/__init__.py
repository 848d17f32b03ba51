"""Single-query decode attention over a packed KV cache: every KV head of a layer, whatever it keeps, in one call.

Design decisions:
- The cache of one layer is packed row by row (`PackedKV`): row ``r = b · H + h`` holds the slots of sample ``b`` and
  KV head ``h``, contiguously. A row that keeps every token has as many slots as tokens (plus room to grow); a
  streaming row that evicts keeps ``sink`` slots and a ring of window slots. Rows of one layer may differ in length,
  so a batch whose prompts were routed differently is one call.
- Each slot records its token's absolute position (``-1``: empty). A row's visible slots are the filled ones at or
  after its ``window_start`` or before its ``sink_end`` (a FULL row: window start 0). One rule covers FULL rows,
  streaming rows that evicted, and streaming rows that kept everything (upstream's behaviour, for comparison).
- GQA without repeating KV heads: the ``G = Hq / H`` query heads of a row are computed together against its slots.
- Backends: ``reference`` (torch, any device; the ground truth) and ``triton`` (a split-K kernel and its combine, on
  CUDA or under ``TRITON_INTERPRET=1``); ``auto`` takes Triton on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import fused
from .naive import naive_decode_attention


@dataclass
class PackedKV:
    """One layer's KV cache, packed by (sample, KV head) rows.

    Attributes:
        keys, values: ``[N, D]`` slots of all rows.
        positions: ``[N]`` int32 absolute position of each slot's token within its sample, ``-1`` for an empty slot.
        offsets: ``[R]`` int64 first slot of each row, ``R = B · H``, row ``b · H + h``.
        slots: ``[R]`` int32 number of slots of each row.
        window_start: ``[R]`` int32; a slot is visible iff it is filled and its position is ``>= window_start`` or
            ``< sink_end``.
        sink_end: ``[R]`` int32.
        max_slots: the largest entry of ``slots`` (a host integer: the kernel's grid).
        long_rows: how many rows hold more than half of ``max_slots`` slots (a host integer; ``None``: all rows). The
            Triton kernel spreads these long rows over the GPU; a layer whose streaming rows evicted has few.
    """

    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    offsets: torch.Tensor
    slots: torch.Tensor
    window_start: torch.Tensor
    sink_end: torch.Tensor
    max_slots: int
    long_rows: int | None = None

    @property
    def num_rows(self) -> int:
        return self.offsets.shape[0]

    def nbytes(self) -> int:
        """Bytes of the stored keys, values and positions (what the cache holds; the per-row vectors are not
        counted: a few bytes per row)."""
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values, self.positions))


def decode_attention(q: torch.Tensor, kv: PackedKV, scale: float | None = None, backend: str = "auto") -> torch.Tensor:
    """Attention of one new token per sample over a packed cache.

    Args:
        q: ``[B, Hq, 1, D]`` queries (post-RoPE); ``B · H`` must equal ``kv.num_rows`` and ``Hq % H == 0``.
        kv: the layer's packed cache, the new token's slots already written.
        scale: softmax scale, ``D ** -0.5`` by default.
        backend: ``"auto"``, ``"reference"`` or ``"triton"``.

    Returns:
        ``[B, Hq, 1, D]`` in ``q.dtype``.
    """
    B, Hq, Lq, D = q.shape
    if Lq != 1:
        raise ValueError(f"decode attention takes one query per sample, got {Lq}")
    if kv.num_rows % B or Hq % (kv.num_rows // B) or kv.keys.shape[1] != D:
        raise ValueError(f"queries {tuple(q.shape)} do not match a packed cache of {kv.num_rows} rows × head_dim "
                         f"{kv.keys.shape[1]}")
    scale = D ** -0.5 if scale is None else scale
    rows = q.reshape(kv.num_rows, Hq * B // kv.num_rows, D)  # [R, G, D]: a row's query heads are adjacent
    if resolve_decode_backend(backend, q.device) == "triton":
        out = fused.triton_decode_attention(rows, kv, scale)
    else:
        out = naive_decode_attention(rows, kv, scale)
    return out.reshape(B, Hq, 1, D)


def resolve_decode_backend(backend: str, device: torch.device) -> str:
    """The decode backend ``backend`` means on ``device``: ``auto`` → ``triton`` where it runs on CUDA, else
    ``reference``; a prefill backend name (``split``, ``flex``, ...) maps the same way, since decode has its own
    kernels."""
    if backend == "reference":
        return "reference"
    if backend == "triton" and not fused.available(device):
        raise RuntimeError(f"the Triton decode kernel is not available on {device}")
    if backend == "triton" or (device.type == "cuda" and fused.available(device)):
        return "triton"
    return "reference"


__all__ = ["PackedKV", "decode_attention", "naive_decode_attention", "resolve_decode_backend"]
