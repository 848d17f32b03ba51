"""HeadPlan: what a sparse-attention method decides for one layer and one forward.

Design decisions:
- A plan is per sample and per KV head (`modes [B, H]`): a batch may route each prompt differently.
- Three modes. FULL is dense causal attention. STREAMING keeps sink + local-window keys, either token-exact or at
  128-block granularity (Block-Sparse-Attention semantics), or as DuoAttention's chunked prefill computes them (a
  dense first chunk, then sink + recent keys + the current chunk: one forward gives what the chunk-by-chunk loop
  over a truncated cache gives, since earlier tokens never depend on later ones). BLOCK_SPARSE keeps a selected set
  of key blocks.
- Block-sparse selections are per *query* head (XAttention selects per query head) and stored compactly as CSR rows
  (`BlockSelection`), never as padded dense masks.
- Positions are absolute and causal alignment is bottom-right: with `Lq` queries and `Lk` keys, query `i` sits at
  position `p_i = Lk - Lq + i` (chunked prefill and decode). Block rows index absolute query blocks `p // block_size`.

The plan is the only thing a kernel needs (`hybrid_attention`) and the only thing sparsity accounting needs
(`elastic_bench.kernels.sparsity`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal

import torch


class Mode(enum.IntEnum):
    """Attention mode of one KV head (and its query heads)."""

    FULL = 0
    STREAMING = 1
    BLOCK_SPARSE = 2


@dataclass(frozen=True)
class StreamingGeometry:
    """Sink + local-window geometry of STREAMING heads, optionally as a chunked prefill computes it.

    Every rule reads absolute positions (a query at ``p`` over keys ``j``), so a call with fewer queries than keys (a
    caller-fed chunk, a decode step) gets the same pattern as those queries get in a one-shot call. A key is visible
    iff ``j <= p`` and (``j < sink_end`` or ``j >= window_start(p)``); see `sink_end` and `window_start`.

    Args:
        sink: number of initial tokens every query sees.
        local: window length in tokens. Unchunked, it counts the query's own token; chunked, it counts the keys kept
            before the query's chunk (DuoAttention's ``recent_size``).
        granularity: ``"token"``: key ``j`` is visible to a query at position ``p`` iff ``j <= p`` and
            (``j < sink`` or ``p - j < local``). ``"block"`` (Block-Sparse-Attention ``block_streaming``): query block
            ``r`` sees key blocks ``[0, ceil(sink/b))`` and ``[r - ceil(local/b) + 1, r]``, causal inside the diagonal
            block; the window then spans ``(l_b - 1)·b + 1 … l_b·b`` tokens.
        chunk_starts: the chunks of a chunked prefill (DuoAttention's deployment; token granularity only): their
            start positions, ``0`` first, strictly ascending; empty (the default): no chunking. A query at position
            ``p`` lies in the chunk ``[s, e)`` whose start ``s`` is the largest one ``<= p`` (positions past the last
            start belong to the last chunk). It sees key ``j`` iff ``j <= p`` and (``j < sink`` or
            ``j >= s - local``): the sink, the last ``local`` keys before its chunk and its chunk up to itself, which
            is what attention over upstream's truncated streaming cache (the first ``sink`` + last ``local`` tokens,
            original RoPE positions) plus the current chunk computes. The first chunk (``s = 0``) is therefore dense,
            and so is a chunk starting at ``s <= sink + local``; ``(0,)`` is one dense chunk.
    """

    sink: int = 128
    local: int = 2048
    granularity: Literal["token", "block"] = "token"
    chunk_starts: tuple[int, ...] = ()

    def __post_init__(self):
        if self.sink < 0 or self.local < 1:
            raise ValueError(f"streaming needs sink >= 0 and local >= 1, got sink={self.sink}, local={self.local}")
        if self.granularity not in ("token", "block"):
            raise ValueError(f"granularity must be 'token' or 'block', got {self.granularity!r}")
        starts = tuple(int(s) for s in self.chunk_starts)
        object.__setattr__(self, "chunk_starts", starts)  # a tuple, so geometries hash (pair counts are cached)
        if starts and self.granularity != "token":
            raise ValueError("a chunked streaming geometry is token-granular")
        if starts and (starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:]))):
            raise ValueError(f"chunk_starts must start at 0 and ascend strictly, got {starts}")

    def blocks(self, block_size: int) -> tuple[int, int]:
        """(sink blocks, local blocks including the diagonal) for block granularity."""
        return -(-self.sink // block_size), -(-self.local // block_size)

    def window_span(self, block_size: int) -> int:
        """The most window keys an unchunked query sees (``local`` for token geometry, whole local blocks for block
        geometry): the ring an evicting cache keeps per streaming head."""
        return self.local if self.granularity == "token" else self.blocks(block_size)[1] * block_size

    def sink_end(self, block_size: int) -> int:
        """Keys below this position are visible to every later query (the sink blocks' extent for block geometry)."""
        return self.sink if self.granularity == "token" else self.blocks(block_size)[0] * block_size

    def window_start(self, pos: torch.Tensor, block_size: int) -> torch.Tensor:
        """The first window key of queries at absolute positions ``pos`` (integer tensor, any shape; the result has its
        shape and may be negative, meaning that every earlier key is in the window)."""
        if self.chunk_starts:
            return self.chunk_start(pos) - self.local
        quantum, back = self.window_steps(block_size)
        return (pos // quantum - back) * quantum

    def window_steps(self, block_size: int) -> tuple[int, int]:
        """``(quantum, back)`` of an unchunked geometry: the window of a query at position ``p`` starts at ``(p //
        quantum - back) · quantum`` (token: quantum 1, back ``local - 1``; block: quantum ``block_size``, back the
        local blocks after the diagonal's)."""
        if self.granularity == "token":
            return 1, self.local - 1
        return block_size, self.blocks(block_size)[1] - 1

    def chunk_start(self, pos: torch.Tensor) -> torch.Tensor:
        """Start of the prefill chunk holding each absolute position of ``pos`` (any shape; 0 in the first chunk)."""
        starts = torch.tensor(self.chunk_starts, dtype=pos.dtype, device=pos.device)
        return starts[torch.searchsorted(starts, pos, right=True) - 1]

    def chunk_spans(self, first: int, stop: int) -> list[tuple[int, int, int]]:
        """``(chunk start, first position, stop)`` of each chunk holding some of the positions ``first … stop - 1``,
        in order; the positions ``first position … stop - 1`` are the chunk's, clipped to that range."""
        bounds = [s for s in self.chunk_starts if first < s < stop]
        starts = [max(s for s in self.chunk_starts if s <= first), *bounds]
        return [(s, max(s, first), e) for s, e in zip(starts, [*bounds, stop])]


@dataclass(frozen=True)
class BlockSelection:
    """Selected key blocks per (sample, query head, absolute query block), stored as CSR rows.

    Attributes:
        counts: int32 ``[B, Hq, nQ]``: number of selected key blocks in each row.
        offsets: int64 ``[B, Hq, nQ]``: start of each row in ``indices`` (exclusive prefix sum of ``counts``).
        indices: int32 ``[nnz]``: key-block ids, ascending within a row.

    ``nQ = ceil(Lk / block_size)`` rows cover the absolute query blocks of the whole key range; a chunk of queries
    reads only its own rows. Blocks above the diagonal (``c > r``) may be listed but are never computed.
    """

    counts: torch.Tensor
    offsets: torch.Tensor
    indices: torch.Tensor

    @property
    def shape(self) -> tuple[int, int, int]:
        """(B, Hq, nQ)."""
        return tuple(self.counts.shape)

    @classmethod
    def from_counts(cls, counts: torch.Tensor, indices: torch.Tensor) -> BlockSelection:
        """Build from per-row counts ``[B, Hq, nQ]`` and the concatenated row contents ``[nnz]``."""
        flat = counts.flatten().to(torch.int64)
        offsets = (torch.cumsum(flat, 0) - flat).view(counts.shape)
        return cls(counts.to(torch.int32), offsets, indices.to(torch.int32))

    @classmethod
    def from_dense(cls, mask: torch.Tensor) -> BlockSelection:
        """Build from a boolean block mask ``[B, Hq, nQ, nK]``."""
        if mask.dim() != 4 or mask.dtype != torch.bool:
            raise ValueError(f"block mask must be bool [B, Hq, nQ, nK], got {mask.dtype} {tuple(mask.shape)}")
        # nonzero() is row-major, so blocks come out ascending within each row.
        return cls.from_counts(mask.sum(-1, dtype=torch.int32), mask.nonzero()[:, 3])

    def to_dense(self, num_key_blocks: int) -> torch.Tensor:
        """Boolean block mask ``[B, Hq, nQ, num_key_blocks]``."""
        B, Hq, nQ = self.shape
        dense = torch.zeros(B * Hq * nQ, num_key_blocks, dtype=torch.bool, device=self.counts.device)
        rows = torch.repeat_interleave(torch.arange(B * Hq * nQ, device=self.counts.device), self.counts.flatten())
        dense[rows, self.indices.long()] = True
        return dense.view(B, Hq, nQ, num_key_blocks)

    def select(self, samples: list[int]) -> BlockSelection:
        """The rows of the given samples only (a sub-batch). A sample's rows are contiguous in ``indices``."""
        parts = []
        for b in samples:
            start = int(self.offsets[b].flatten()[0])
            parts.append(self.indices[start : start + int(self.counts[b].sum())])
        return BlockSelection.from_counts(self.counts[list(samples)], torch.cat(parts))


@dataclass(frozen=True)
class HeadPlan:
    """Per-sample, per-KV-head attention modes of one layer for one forward.

    Attributes:
        modes: uint8 ``[B, H]`` of ``Mode`` values, one per sample and KV head, on the host or the device. Host modes
            (what a static method knows before the call) spare the device synchronisations that reading device modes
            on the host costs (``has``, the split of FULL heads, pair counts); every kernel takes either.
        streaming: geometry shared by the STREAMING heads of this plan. A chunked one (``chunk_starts``) combines
            with FULL heads only.
        blocks: selected key blocks for BLOCK_SPARSE heads, per query head (``[B, Hq, nQ]`` CSR); required iff a
            head is BLOCK_SPARSE. Rows of other heads are ignored.
        block_size: key/query block size in tokens (128 by default, as Block-Sparse-Attention and FlexAttention).
    """

    modes: torch.Tensor
    streaming: StreamingGeometry = field(default_factory=StreamingGeometry)
    blocks: BlockSelection | None = None
    block_size: int = 128

    def __post_init__(self):
        if self.modes.dim() != 2:
            raise ValueError(f"HeadPlan.modes must be [B, H], got shape {tuple(self.modes.shape)}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.blocks is None and bool((self.modes == Mode.BLOCK_SPARSE).any()):
            raise ValueError("a BLOCK_SPARSE head needs a BlockSelection (HeadPlan.blocks)")
        if self.streaming.chunk_starts and self.blocks is not None:
            raise ValueError("a chunked streaming geometry combines with FULL heads only (no BlockSelection)")

    @property
    def batch_size(self) -> int:
        return self.modes.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.modes.shape[1]

    @classmethod
    def uniform(cls, mode: Mode, batch_size: int, num_kv_heads: int, device=None, **kwargs) -> HeadPlan:
        """Every head of every sample in ``mode``."""
        modes = torch.full((batch_size, num_kv_heads), int(mode), dtype=torch.uint8, device=device)
        return cls(modes, **kwargs)

    @classmethod
    def full(cls, batch_size: int, num_kv_heads: int, device=None) -> HeadPlan:
        """All heads dense causal."""
        return cls.uniform(Mode.FULL, batch_size, num_kv_heads, device=device)

    def select(self, samples: list[int]) -> HeadPlan:
        """The plan of a sub-batch."""
        idx = torch.as_tensor(samples, dtype=torch.long, device=self.modes.device)
        blocks = self.blocks.select(samples) if self.blocks is not None else None
        return HeadPlan(self.modes[idx], self.streaming, blocks, self.block_size)

    def has(self, mode: Mode) -> bool:
        return bool((self.modes == int(mode)).any())
