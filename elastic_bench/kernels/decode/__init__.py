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
- A decode token is written into every row by one call too (`append_token`: one program per row on the GPU, instead
  of a dozen small torch operations per layer that a CUDA-graph replay would launch one by one). Positions advance on
  the device, so a replayed step appends one position further.
- Backends: ``reference`` (torch, any device; the ground truth) and ``triton`` (a split-K kernel and its combine, and
  the append program, on CUDA or under ``TRITON_INTERPRET=1``); ``auto`` takes Triton on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..triton_available import triton_available
from . import fused
from .naive import naive_append_token, naive_decode_attention


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


@dataclass(frozen=True)
class AppendRule:
    """Where `append_token` writes a row's new token, and how the row's window start follows it.

    Attributes:
        ring: ``[R]`` bool; such a row keeps ``ring_sink`` sink slots and a ring of ``ring_span`` window slots, the
            token at position ``p >= ring_sink`` going to slot ``ring_sink + (p - ring_sink) % ring_span``; other rows
            put position ``p`` in slot ``p``.
        streaming: ``[R]`` bool; such a row's window starts at ``(p // quantum - back) · quantum`` after the token at
            ``p``, the others' at 0.
        ring_sink, ring_span, quantum, back: host integers.
    """

    ring: torch.Tensor
    streaming: torch.Tensor
    ring_sink: int
    ring_span: int
    quantum: int
    back: int

    def __post_init__(self):
        if self.ring_span < 1 or self.quantum < 1:
            raise ValueError(f"an append rule needs ring_span >= 1 and quantum >= 1, got {self.ring_span} and "
                             f"{self.quantum}")


def append_token(kv: PackedKV, key: torch.Tensor, value: torch.Tensor, newest: torch.Tensor, rule: AppendRule,
                 backend: str = "auto") -> None:
    """Write one decode token per row into ``kv``, in place.

    Args:
        kv: the layer's packed cache; its keys, values, positions and window starts are updated.
        key, value: ``[R, D]`` the new token's states, row ``b · H + h``.
        newest: ``[R]`` int32 position of each row's newest token, advanced by one in place.
        rule: where each row's token goes (`AppendRule`).
        backend: ``"auto"``, ``"reference"`` or ``"triton"``.
    """
    if key.shape != (kv.num_rows, kv.keys.shape[1]) or value.shape != key.shape:
        raise ValueError(f"a packed cache of {kv.num_rows} rows × head_dim {kv.keys.shape[1]} appends keys and values "
                         f"of shape {(kv.num_rows, kv.keys.shape[1])}, got {tuple(key.shape)} and {tuple(value.shape)}")
    if resolve_decode_backend(backend, key.device) == "triton":
        fused.triton_append_token(kv, key, value, newest, rule)
    else:
        naive_append_token(kv, key, value, newest, rule)


def resolve_decode_backend(backend: str, device: torch.device) -> str:
    """The decode backend ``backend`` means on ``device``: ``auto`` → ``triton`` where it runs on CUDA, else
    ``reference``; a prefill backend name (``split``, ``flex``, ...) maps the same way, since decode has its own
    kernels."""
    if backend == "reference":
        return "reference"
    if backend == "triton" and not triton_available(device):
        raise RuntimeError(f"the Triton decode kernel is not available on {device}")
    if backend == "triton" or (device.type == "cuda" and triton_available(device)):
        return "triton"
    return "reference"


__all__ = ["AppendRule", "PackedKV", "append_token", "decode_attention", "naive_append_token", "naive_decode_attention",
           "resolve_decode_backend"]
