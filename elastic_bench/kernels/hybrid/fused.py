"""Fused hybrid-head prefill attention on the GPU: ``backend="triton"`` and ``backend="split"``.

Design decisions:
- ``triton``: one launch of `fused_kernel.hybrid_fwd` computes every head of the layer. FULL and STREAMING
  tiles pack the query heads of a GQA group so one K/V tile load serves them all; BLOCK_SPARSE tiles read the plan's CSR
  rows (`BlockSelection`) directly; streaming key ranges are computed, never stored.
- Heaviest first: programs take query tiles from the last to the first. A causal tile's work grows with its position
  in every mode (FULL: all earlier blocks; BLOCK_SPARSE: a density of them; STREAMING: constant), so this is the
  longest-processing-time order without sorting anything, and the cheap early tiles fill the tail. The query heads of
  one tile are adjacent in launch order and share K/V tiles in L2.
- No device-to-host synchronisation and no auxiliary tensors: the grid is ``B · Hq · tiles`` and each program decodes
  its item from its id (host work per call is the launch itself, which matters at 8K where a call takes ~1 ms).
- ``split``: FULL heads go to the fastest dense kernel PyTorch has (`scaled_dot_product_attention`, cuDNN or flash),
  the other heads to one launch of the same Triton program. SDPA reaches a higher dense rate than the Triton program,
  so a plan with FULL heads runs faster this way; see docs/benchmarks.md ("Kernels") for the measured comparison.
- Tile configurations per head dimension were chosen by measurement on an H200 (docs/benchmarks.md); under
  ``TRITON_INTERPRET=1`` the program runs on the CPU (tests).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ..plan import HeadPlan, Mode
from .chunked import check_unchunked

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class TileConfig:
    """Launch shape: query rows per program, keys per inner step, warps, software-pipelining depth, whether K/V
    tiles are loaded through TMA tensor descriptors (Hopper and newer) instead of pointer arithmetic, and the
    pipelining depth of the block-list loop (None: ``num_stages``). That loop loads each block's index before its
    K/V tiles and Triton's pipeliner gives the index load stages of its own, so at ``num_stages`` the loop keeps one
    K/V tile fewer in flight than the contiguous loops; a deeper setting gives it back."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 3
    tma: bool = False
    gather_stages: int | None = None


# Per head dimension (padded to a power of two). 128: six shapes compared on an H200 at 32K, then the pipeline depth
# (3 over 2), the block-list loop's depth (6: -11% block-sparse time at 128K; 4 changes nothing, 5 equals 6) and
# variants at 8K-128K (docs/benchmarks.md, "Kernels"); other head dims are not tuned.
CONFIGS: dict[int, TileConfig] = {
    16: TileConfig(64, 64, 4, 3, True),
    32: TileConfig(64, 64, 4, 3, True),
    64: TileConfig(128, 64, 4, 3, True),
    128: TileConfig(128, 128, 8, 3, True, 6),
    256: TileConfig(64, 32, 8, 2, True),
}

# Launches that compute token-granular STREAMING tiles only (``skip_full`` with no block selection: the Triton launch
# of ``split`` for FA-SSA and all-streaming plans). A streaming tile does a constant ``sink + local`` keys of work, so
# smaller tiles waste less at the window's edges; in the model at 128K, 64 x 64 with 4 warps ran the all-streaming
# prefill 0.5% faster than 128 x 128 with 8 warps (docs/benchmarks.md, "Prefill, end to end").
STREAMING_CONFIGS: dict[int, TileConfig] = {
    128: TileConfig(64, 64, 4, 3, True),
}


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _pack(groups: int, block_m: int) -> int:
    """Query heads per packed tile: the largest power of two dividing ``groups`` that leaves >= 16 rows per head."""
    pack = 1
    while groups % (pack * 2) == 0 and block_m // (pack * 2) >= 16:
        pack *= 2
    return pack


def _config(q: torch.Tensor, plan: HeadPlan, config: TileConfig | None, skip_full: bool) -> TileConfig:
    blocky = plan.blocks is not None or plan.streaming.granularity == "block"
    if config is None and skip_full and not blocky:  # streaming tiles only
        config = STREAMING_CONFIGS.get(_pow2(max(q.shape[-1], 16)))
    return _fit_config(config, q.shape[-1], q.dtype, plan.block_size if blocky else None)


@functools.cache  # per-call host time matters at short lengths; the inputs of this choice rarely change
def _fit_config(config: TileConfig | None, head_dim: int, dtype: torch.dtype, block_size: int | None) -> TileConfig:
    """The launch shape for a head dim and dtype, clipped to ``block_size`` when the plan has block geometry."""
    cfg = config or CONFIGS.get(_pow2(max(head_dim, 16)))
    if cfg is None:
        raise ValueError(f"the triton backend supports head_dim up to 256, got {head_dim}")
    if dtype == torch.float32:  # twice the bytes per tile: halve the key step and the pipeline depth
        cfg = replace(cfg, block_n=max(16, cfg.block_n // 2), num_stages=2, gather_stages=None)
    if block_size is not None:
        if block_size & (block_size - 1) or block_size < 16:
            raise ValueError(f"the triton backend needs a power-of-two block_size >= 16, got {block_size}")
        cfg = replace(cfg, block_m=min(cfg.block_m, block_size), block_n=min(cfg.block_n, block_size))
    return cfg


def streaming_params(plan: HeadPlan) -> tuple[int, int, int]:
    """(sink end, window quantum, quantum steps back) of the plan's streaming geometry (see `hybrid_fwd`)."""
    check_unchunked(plan)
    geo, bs = plan.streaming, plan.block_size
    return geo.sink_end(bs), *geo.window_steps(bs)


def triton_hybrid_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: HeadPlan,
    scale: float,
    skip_full: bool = False,
    out: torch.Tensor | None = None,
    config: TileConfig | None = None,
) -> torch.Tensor:
    """Hybrid attention in one Triton launch (``backend="triton"``).

    Args:
        q: ``[B, Hq, Lq, D]``; k, v: ``[B, H, Lk, D]`` (any strides with a contiguous last dimension); fp16, bf16 or
            fp32; ``D <= 256``.
        plan: modes ``[B, H]``; CSR block rows ``[B, Hq, ceil(Lk / block_size)]`` for BLOCK_SPARSE heads.
        scale: softmax scale.
        skip_full: leave the rows of FULL heads unwritten (``split`` computes them with SDPA).
        out: ``[B, Hq, Lq, D]`` to write into (allocated when None).
        config: tile configuration; when None, per head dimension from `STREAMING_CONFIGS` for a launch that
            computes token-granular streaming tiles only, else from `CONFIGS`.

    Returns:
        ``[B, Hq, Lq, D]`` in ``q.dtype``; a block-sparse query row with no selected visible key is zero.
    """
    from .fused_kernel import hybrid_fwd

    B, Hq, Lq, D = q.shape
    H, Lk = k.shape[1], k.shape[2]
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    cfg = _config(q, plan, config, skip_full)
    out = torch.empty_like(q) if out is None else out
    first_tile = (Lk - Lq) // cfg.block_m
    n_tiles = -(-Lk // cfg.block_m) - first_tile
    if plan.blocks is not None:
        sel = plan.blocks
        counts, offsets, indices = (t.to(q.device) for t in (sel.counts, sel.offsets, sel.indices))
        n_rows = sel.shape[2]
    else:
        counts, offsets, indices = _no_blocks(q.device)
        n_rows = 1
    sink_end, quantum, back = streaming_params(plan)
    modes = plan.modes.to(device=q.device, dtype=torch.uint8, non_blocking=True).contiguous()
    d_pad = _pow2(max(D, 16))
    k_desc = v_desc = None
    if _use_tma(cfg, k, v, d_pad):
        from triton.tools.tensor_descriptor import TensorDescriptor

        k_desc, v_desc = (TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, cfg.block_n, D]) for t in (k, v))
    pack = _pack(Hq // H, cfg.block_m)
    hybrid_fwd[(B * Hq * n_tiles,)](
        q, k, v, out, k_desc, v_desc, modes, counts, offsets, indices,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        B, Hq, H, Hq // H, Lq, Lk, n_tiles, first_tile, n_rows, plan.block_size,
        sink_end, quantum, back, scale * LOG2E,
        D=D, D_PAD=d_pad, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, PACK=pack,
        SMALL_N=min(cfg.block_n, max(16, cfg.block_m // pack)),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", USE_TMA=k_desc is not None,
        SKIP_MODE=int(Mode.FULL) if skip_full else -1, GATHER_STAGES=cfg.gather_stages,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


@functools.cache
def _no_blocks(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Placeholder CSR arguments (counts, offsets, indices) for a plan without BLOCK_SPARSE heads, made once."""
    zero32 = torch.zeros(1, dtype=torch.int32, device=device)
    return zero32, torch.zeros(1, dtype=torch.int64, device=device), zero32


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def _use_tma(cfg: TileConfig, k: torch.Tensor, v: torch.Tensor, d_pad: int) -> bool:
    """TMA needs Hopper or newer (or the interpreter), an unpadded head dim and 16-byte aligned bases and strides."""
    if not cfg.tma or k.shape[-1] != d_pad:
        return False
    if k.device.type == "cuda" and _capability(k.device)[0] < 9:
        return False
    size = k.element_size()
    return all(t.data_ptr() % 16 == 0 and all(s * size % 16 == 0 for s in t.stride()[:-1]) for t in (k, v))


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Dense causal GQA attention with bottom-right alignment through `scaled_dot_product_attention`.

    Args:
        q: ``[N, Hq, Lq, D]``; k, v: ``[N, H, Lk, D]``, ``Lq <= Lk``.

    Returns:
        ``[N, Hq, Lq, D]``.
    """
    Lq, Lk = q.shape[2], k.shape[2]
    if Lq == Lk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    from torch.nn.attention.bias import causal_lower_right

    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(Lq, Lk), scale=scale)


SPLIT_MIN_KEYS = 32768


def split_pays_off(keys: int) -> bool:
    """Whether ``auto`` takes ``split`` over one Triton launch: from `SPLIT_MIN_KEYS` keys on. Measured on an H200
    (docs/benchmarks.md, "Kernels"), three-way plan: at 8K the SDPA call and its gather cost more than SDPA's faster
    dense rate saves (1.02 vs 0.80 ms), at 16K the two are within 7% either way, from 32K on ``split`` wins (6.33 vs
    7.15 ms). Plans without FULL heads run the same launch either way."""
    return keys >= SPLIT_MIN_KEYS


def split_hybrid_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: HeadPlan, scale: float
) -> torch.Tensor:
    """Hybrid attention with FULL heads on SDPA and all other heads in one Triton launch (``backend="split"``).

    Shapes as `triton_hybrid_attention`. The FULL (sample, KV head) pairs are gathered into one SDPA batch
    ``[n_full, G, Lq, D]``, so per-sample plans need no loop.
    """
    H = k.shape[1]
    G = q.shape[1] // H
    full = (plan.modes == Mode.FULL).cpu()  # a device-to-host copy (a synchronisation) only for device modes
    if bool(full.all()):
        return dense_attention(q, k, v, scale)
    pairs = [i.to(q.device, non_blocking=True) for i in full.nonzero(as_tuple=True)]  # staged: no wait
    out = triton_hybrid_attention(q, k, v, plan, scale, skip_full=True)
    if len(pairs[0]):
        b_idx, h_idx = pairs
        qg = q.unflatten(1, (H, G))[b_idx, h_idx]  # [n_full, G, Lq, D]
        dense = dense_attention(qg, k[b_idx, h_idx].unsqueeze(1), v[b_idx, h_idx].unsqueeze(1), scale)
        out.unflatten(1, (H, G))[b_idx, h_idx] = dense
    return out
