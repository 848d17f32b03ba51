"""The selection step the top-k block methods share: per row, the forced key blocks and the best-scoring others, up
to ``k``, as a `BlockSelection` of the plan's blocks.

Scores come in the method's key blocks (`elastic_bench.kernels.topk.scores`), ``+inf`` for a forced block and ``-inf``
for one the row may not take (beyond its causal reach). A row takes its forced blocks first, then the others by
descending score, ties going to the lower block index, until it holds ``k`` blocks or runs out of candidates.
"""

from __future__ import annotations

import torch

from ..plan import BlockSelection


def select_top_k(scores: torch.Tensor, k: int, first_row: int, num_rows: int, ratio: int, group: int) -> BlockSelection:
    """The ``k`` best key blocks of each row, expanded to the plan's blocks.

    Args:
        scores: float ``[B, S, n, nK]`` row scores of the rows ``first_row … first_row + n - 1`` over the method's
            ``nK`` key blocks (``+inf`` forced, ``-inf`` not a candidate), ``S`` the selecting heads: KV heads when a
            GQA group shares its selection (``group`` query heads each), query heads when ``group`` is 1.
        k: blocks kept per row, forced ones included.
        first_row, num_rows: the first scored row, and every row of the selection (``ceil(Lk / block)``); rows before
            ``first_row`` hold no query of the call and stay empty.
        ratio: plan blocks per method key block: method block ``c`` is plan blocks ``c·ratio … c·ratio + ratio - 1``,
            of which a row keeps those up to its own (diagonal) block.
        group: query heads per selecting head (each takes its selecting head's rows).

    Returns:
        `BlockSelection` with rows ``[B, S·group, num_rows]``.
    """
    B, S, n, nK = scores.shape
    take = min(k, nK)
    device = scores.device
    values, order = scores.sort(dim=-1, descending=True, stable=True)
    chosen = order[..., :take]
    kept = values[..., :take] > float("-inf")
    chosen = torch.where(kept, chosen, nK).sort(dim=-1).values  # ascending, the blocks not taken (nK) last
    plan = chosen[..., None] * ratio + torch.arange(ratio, device=device)  # [B, S, n, take, ratio]
    rows = first_row + torch.arange(n, device=device)
    valid = (chosen < nK)[..., None] & (plan <= rows[:, None, None])
    valid = valid.flatten(-2).repeat_interleave(group, dim=1)  # [B, Hq, n, take·ratio]
    plan = plan.flatten(-2).repeat_interleave(group, dim=1)
    counts = torch.zeros(B, S * group, num_rows, dtype=torch.int32, device=device)
    counts[:, :, first_row:] = valid.sum(-1, dtype=torch.int32)
    return BlockSelection.from_counts(counts, plan[valid])  # row-major: rows in order, blocks ascending in a row
