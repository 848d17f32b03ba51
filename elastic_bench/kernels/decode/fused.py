"""The Triton decode kernel (``backend="triton"``): split-K attention of one query per row over packed slots.

One program takes one row (a sample's KV head) and one split of its slots; it loads the row's ``G`` query heads once
(padded to 16 for the tensor-core dot) and walks its slots in ``BLOCK_N`` steps with an online softmax in fp32.
Splits spread a long row over the GPU (a batch of one at 128K tokens has only ``H`` rows), their number chosen for
the layer's long rows (`PackedKV.long_rows`): a layer whose streaming rows evicted has few. A second launch combines
the splits' partial results by their log-sum-exp. Short rows (a streaming row's sink + window) fill their first
splits; their splits past the row's end return at once and are not combined. Imported on first use; Triton is
imported by `_kernels`.
"""

from __future__ import annotations

import functools

import torch

BLOCK_N = 64
PROGRAMS_PER_SM = 4  # target splits · rows per streaming multiprocessor
MAX_SPLITS = 512  # splits per row at most: `combine` holds a head's splits × ``COMBINE_DIMS`` in registers
COMBINE_DIMS = 32  # head dimensions merged per program of `combine`


@functools.cache
def _processors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def _splits(rows: int, max_slots: int, device: torch.device) -> tuple[int, int]:
    """(splits per row, slots per split): enough programs over ``rows`` long rows to fill the GPU, each split a whole
    number of ``BLOCK_N``."""
    blocks = max(-(-max_slots // BLOCK_N), 1)
    splits = min(max(-(-PROGRAMS_PER_SM * _processors(device) // rows), 1), blocks, MAX_SPLITS)
    per_split = -(-blocks // splits) * BLOCK_N
    return -(-max_slots // per_split) if max_slots else 1, per_split


def triton_decode_attention(q: torch.Tensor, kv, scale: float) -> torch.Tensor:
    """``q [R, G, D]`` over `PackedKV` ``kv`` → ``[R, G, D]`` in ``q.dtype``."""
    from ._kernels import combine, decode_partial

    R, G, D = q.shape
    if D < 16 or D & (D - 1):
        raise ValueError(f"the Triton decode kernel needs a power-of-two head_dim >= 16, got {D}")
    q = q.contiguous()
    splits, per_split = _splits(kv.long_rows or R, kv.max_slots, q.device)
    out = torch.empty_like(q)
    partial = torch.empty((R, splits, G, D), dtype=torch.float32, device=q.device)
    stats = torch.empty((2, R, splits, G), dtype=torch.float32, device=q.device)  # running max, sum of weights
    g_pad = max(16, 1 << (G - 1).bit_length())
    decode_partial[(R, splits)](
        q, kv.keys, kv.values, kv.positions, kv.offsets, kv.slots, kv.window_start, kv.sink_end, partial, stats,
        scale, per_split, splits, R * splits * G,
        G=G, G_PAD=g_pad, D=D, BLOCK_N=BLOCK_N, IEEE=q.dtype == torch.float32, num_warps=4,
    )
    block_d = min(COMBINE_DIMS, D)
    combine[(R * G, D // block_d)](partial, stats, out, kv.slots, per_split, splits, R * splits * G, G=G, D=D,
                                   SPLITS_PAD=max(1 << (splits - 1).bit_length(), 2), BLOCK_D=block_d, num_warps=4)
    return out


def triton_append_token(kv, key: torch.Tensor, value: torch.Tensor, newest: torch.Tensor, rule) -> None:
    """`append_token` by `AppendRule` ``rule`` in one launch of one program per row."""
    from ._kernels import append_token

    R, D = key.shape
    append_token[(R,)](
        key.contiguous(), value.contiguous(), kv.keys, kv.values, kv.positions, kv.offsets, newest, rule.ring,
        rule.streaming, kv.window_start, rule.ring_sink, rule.ring_span, rule.quantum, rule.back,
        D=D, D_PAD=1 << max(D - 1, 0).bit_length(), num_warps=1,
    )
