"""Row scores of the top-k block methods in plain PyTorch: what each upstream scores per query, summed over the
queries of each row, with the forced blocks at ``+inf`` and the blocks beyond a row's reach at ``-inf``.

Shapes: queries ``q [B, Hq, Lq, D]`` at absolute positions ``p = Lk - Lq + i``, keys ``k [B, H, Lk, D]``; a row is
the queries of one plan block (``p // block_size``). Each function returns ``(scores, first_row)``: ``scores
[B, S, n, nK]`` (fp32) of the rows ``first_row …`` that hold a query of the call, ``S`` the selecting heads, ``nK``
the method's key blocks. The InfLLM-V2 and NSA scores are computed a few rows at a time (`ELEMENTS` bounds a chunk's
query × compressed-key matrix: 2^25 scores on the CPU, 2^28 on a GPU, where fewer and larger chunks spare launches),
each chunk over the compressed keys its queries can see.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

ELEMENTS = {"cpu": 1 << 25, "cuda": 1 << 28}  # the most (query head × query × key) scores a chunk of rows holds


def mean_pool(k: torch.Tensor, size: int, stride: int) -> torch.Tensor:
    """Means of ``size`` consecutive keys every ``stride``, the windows that lie wholly inside the keys: ``k [B, H, L,
    D]`` → fp32 ``[B, H, n, D]`` with ``n = (L - size) // stride + 1`` (0 when ``L < size``); window ``j`` covers keys
    ``j·stride … j·stride + size - 1``."""
    B, H, L, D = k.shape
    if L < size:
        return k.new_zeros(B, H, 0, D, dtype=torch.float32)
    return k.float().unfold(2, size, stride).mean(-1)


def visible(positions: torch.Tensor, n: int, size: int, stride: int) -> torch.Tensor:
    """Bool ``[c, n]``: which of ``n`` pooled windows (`mean_pool`) lie wholly at or before each query position."""
    return torch.arange(n, device=positions.device) * stride + size - 1 <= positions[:, None]


def _row_chunks(q_len: int, k_len: int, block_size: int, per_query: int, device: torch.device
                ) -> Iterator[tuple[int, int, int, int]]:
    """``(first row, stop row, first position, stop position)`` of consecutive chunks of the rows holding the call's
    queries, each at most `ELEMENTS` / ``per_query`` queries on ``device`` (one row at least)."""
    off = k_len - q_len
    rows = max(1, ELEMENTS.get(device.type, ELEMENTS["cpu"]) // max(per_query * block_size, 1))
    for r0 in range(off // block_size, -(-k_len // block_size), rows):
        r1 = min(r0 + rows, -(-k_len // block_size))
        yield r0, r1, max(off, r0 * block_size), min(k_len, r1 * block_size)


def _row_sum(x: torch.Tensor, r0: int, r1: int, p0: int, block_size: int) -> torch.Tensor:
    """Per-query values ``[..., c, K]`` of positions ``p0 …`` summed per row: ``[..., r1 - r0, K]``."""
    front, back = p0 - r0 * block_size, (r1 - r0) * block_size - (p0 - r0 * block_size) - x.shape[-2]
    x = F.pad(x, (0, 0, front, back))
    return x.view(*x.shape[:-2], r1 - r0, block_size, x.shape[-1]).sum(-2)


def _mark(scores: torch.Tensor, rows: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
    """``scores [..., n, nK]`` with the blocks of ``forced [n, nK]`` at ``+inf`` and those above each row's diagonal
    block at ``-inf`` (method blocks are the plan's here)."""
    c = torch.arange(scores.shape[-1], device=scores.device)
    beyond = c[None, :] > rows[:, None]
    return scores.masked_fill(forced & ~beyond, float("inf")).masked_fill(beyond, float("-inf"))


def _compressed(q: torch.Tensor, keys: torch.Tensor, p0: int, p1: int, off: int, size: int, stride: int,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled scores ``[B, H, G, c, n]`` of the queries at positions ``p0 … p1 - 1`` against the pooled windows
    ``keys [B, H, n, D]`` that the last of them can see, and which of those each query sees (``[c, n]``)."""
    B, Hq, _, D = q.shape
    H = keys.shape[1]
    n = min(keys.shape[2], max(0, (p1 - size) // stride + 1))  # windows ending at or before p1 - 1
    qc = q[:, :, p0 - off: p1 - off].float().view(B, H, Hq // H, p1 - p0, D)
    s = torch.einsum("bhgcd,bhnd->bhgcn", qc, keys[:, :, :n]) * scale
    return s, visible(torch.arange(p0, p1, device=q.device), n, size, stride)


def infllm_v2_scores(q: torch.Tensor, k: torch.Tensor, block_size: int, kernel_size: int, kernel_stride: int,
                     init_blocks: int, local_blocks: int) -> tuple[torch.Tensor, int]:
    """InfLLM-V2's block scores, summed over each row, per KV head (a GQA group shares them): ``[B, H, n, nK]``,
    key blocks of ``block_size`` (the plan's).

    Per query at ``p`` and query head: ``exp(s·q·c_j - lse)`` for every fine compressed key ``c_j`` (means of
    ``kernel_size`` keys every ``kernel_stride``) wholly at or before ``p``, 0 for the others, where ``lse`` is the
    log-sum-exp of the scores against the coarse compressed keys (``4·kernel_size`` keys every ``4·kernel_stride``)
    wholly at or before ``p`` (a query seeing none contributes nothing); summed over the group's query heads; max-pooled
    into key blocks, block ``c`` taking the fine keys ``c·r - 1 … c·r + r`` (``r = block_size / kernel_stride``).
    Forced: the ``init_blocks`` first blocks and the ``local_blocks`` blocks before the row's own, that one included.
    """
    B, Hq, Lq, D = q.shape
    Lk = k.shape[2]
    off, scale, ratio = Lk - Lq, D**-0.5, block_size // kernel_stride
    fine = mean_pool(k, kernel_size, kernel_stride)
    coarse = mean_pool(k, 4 * kernel_size, 4 * kernel_stride)
    n_fine, n_blocks = fine.shape[2], -(-Lk // block_size)
    parts = []
    for r0, r1, p0, p1 in _row_chunks(Lq, Lk, block_size, B * Hq * max(n_fine, 1), q.device):
        s, seen = _compressed(q, fine, p0, p1, off, kernel_size, kernel_stride, scale)
        s2, seen2 = _compressed(q, coarse, p0, p1, off, 4 * kernel_size, 4 * kernel_stride, scale)
        lse = s2.masked_fill(~seen2, float("-inf")).logsumexp(-1, keepdim=True)  # [B, H, G, c, 1]
        lse = lse.masked_fill(torch.isinf(lse), float("inf"))  # a query seeing no coarse key weighs nothing
        weight = torch.exp(s.masked_fill_(~seen, float("-inf")).sub_(lse)).sum(2)  # [B, H, c, n]
        # fine keys the chunk cannot see score 0; windows reaching past the fine keys stop at the last one
        padded = weight.new_full((*weight.shape[:-1], max(n_fine, n_blocks * ratio) + 1), float("-inf"))
        padded[..., 1: n_fine + 1] = 0.0
        padded[..., 1: weight.shape[-1] + 1] = weight
        pooled = padded.unfold(-1, ratio + 1, ratio)[..., :n_blocks, :].amax(-1)  # [B, H, c, nK]
        parts.append(_row_sum(pooled, r0, r1, p0, block_size))
    rows = torch.arange(off // block_size, n_blocks, device=q.device)
    c = torch.arange(n_blocks, device=q.device)
    forced = (c[None, :] < init_blocks) | ((c[None, :] >= rows[:, None] - local_blocks) & (c[None, :] <= rows[:, None]))
    return _mark(torch.cat(parts, dim=2), rows, forced), off // block_size


def nsa_scores(q: torch.Tensor, k: torch.Tensor, block_size: int, kernel_size: int, kernel_stride: int,
               init_blocks: int, local_blocks: int) -> tuple[torch.Tensor, int]:
    """NSA's selection scores, summed over each row, per KV head (a GQA group shares them): ``[B, H, n, nK]``, key
    blocks of ``block_size`` (the plan's).

    Per query at ``p`` and query head: the softmax, over the compressed keys (means of ``kernel_size`` keys every
    ``kernel_stride``) wholly at or before ``p``, of ``s·q·c_j`` (0 for a query seeing none); summed over the group's
    query heads; a block's score is the sum of its overlapping compressed keys' scores, each weighted by the
    ``kernel_stride`` segments it shares with the block (NSA's Eq. 9).
    Forced: the ``init_blocks`` first blocks and the ``local_blocks`` blocks ending with the row's own.
    """
    B, Hq, Lq, D = q.shape
    Lk = k.shape[2]
    off, scale, ratio, span = Lk - Lq, D**-0.5, block_size // kernel_stride, kernel_size // kernel_stride
    fine = mean_pool(k, kernel_size, kernel_stride)
    n_fine, n_blocks = fine.shape[2], -(-Lk // block_size)
    overlap = torch.ones(1, 1, span, device=q.device)
    counts = F.conv1d(F.pad(torch.ones(1, 1, ratio, device=q.device), (span - 1, span - 1)), overlap)[0, 0]
    parts = []
    for r0, r1, p0, p1 in _row_chunks(Lq, Lk, block_size, B * Hq * max(n_fine, 1), q.device):
        s, seen = _compressed(q, fine, p0, p1, off, kernel_size, kernel_stride, scale)
        prob = torch.softmax(s.masked_fill(~seen, float("-inf")), dim=-1).nan_to_num(0.0).sum(2)  # [B, H, c, n]
        width = (n_blocks - 1) * ratio + span + ratio - 1  # the padded fine keys the last block's window ends at
        prob = F.pad(prob, (span - 1, max(0, width - (span - 1) - prob.shape[-1])))
        block = (prob.unfold(-1, span + ratio - 1, ratio)[..., :n_blocks, :] * counts).sum(-1)  # [B, H, c, nK]
        parts.append(_row_sum(block, r0, r1, p0, block_size))
    rows = torch.arange(off // block_size, n_blocks, device=q.device)
    c = torch.arange(n_blocks, device=q.device)
    forced = (c[None, :] < init_blocks) | ((c[None, :] > rows[:, None] - local_blocks) & (c[None, :] <= rows[:, None]))
    return _mark(torch.cat(parts, dim=2), rows, forced), off // block_size


def moba_scores(q: torch.Tensor, k: torch.Tensor, block_size: int, chunk_size: int) -> tuple[torch.Tensor, int]:
    """MoBA's gates, summed over each row, per query head: ``[B, Hq, n, nC]`` over the ``chunk_size``-token chunks
    (``block_size`` divides ``chunk_size``).

    Per query and query head: ``q·k̄_c`` with ``k̄_c`` the mean key of chunk ``c``. Forced: the row's own chunk;
    chunks after it are not candidates (so a partial last chunk, whose mean is taken over ``chunk_size`` here, is
    never ranked).
    """
    B, Hq, Lq, D = q.shape
    H, Lk = k.shape[1], k.shape[2]
    off, n_chunks = Lk - Lq, -(-Lk // chunk_size)
    padded = F.pad(k.float(), (0, 0, 0, n_chunks * chunk_size - Lk))
    means = padded.view(B, H, n_chunks, chunk_size, D).sum(3) / chunk_size
    parts = []
    for r0, r1, p0, p1 in _row_chunks(Lq, Lk, block_size, B * Hq * D, q.device):
        rows = _row_sum(q[:, :, p0 - off: p1 - off].float(), r0, r1, p0, block_size)  # [B, Hq, n, D]
        parts.append(torch.einsum("bhgnd,bhcd->bhgnc", rows.view(B, H, Hq // H, r1 - r0, D), means).flatten(1, 2))
    rows = torch.arange(off // block_size, -(-Lk // block_size), device=q.device)
    own = rows * block_size // chunk_size
    c = torch.arange(n_chunks, device=q.device)
    scores = torch.cat(parts, dim=2)
    scores = scores.masked_fill(c[None, :] == own[:, None], float("inf"))
    return scores.masked_fill(c[None, :] > own[:, None], float("-inf")), off // block_size

