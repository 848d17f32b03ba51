"""The training objective: LM loss plus a per-category Lagrangian on each sample's soft ΩMSR.

Paper: https://arxiv.org/abs/2601.17367 Eq. 8, ``max_λ min_router CE + λ1·(Ω − t) + λ2·(Ω − t)²``, with task-specific
multipliers trained by gradient ascent (as in PruLong); loss assembly as the official ``Qwen3Model.forward``
(``LCM-Lab/Elastic-Attention``, ``elasticattn/training/modeling_flash_qwen.py``).

Design decisions:
- Ω of a sample is ``1 − mean_{ℓ,h} r`` over the straight-through decisions ``r`` of all layers and KV heads: hard in
  the forward pass, soft in the gradient.
- Penalty of a sample of category k: ``λ1[k]·D + λ2[k]·D²`` with ``D = Ω − t_k`` (``penalty="abs"``: the official
  ``λ1·|D| + λ2·D²``). With ``t_interval=(lo, hi)`` (an extension, off by default) ``D`` is the distance to the
  interval (0 inside it).
- The penalty of a micro-batch is the mean over the categories present of the within-category mean.
- λ ascends: the optimizer group of `LagrangeMultipliers` uses ``maximize=True`` on the same total loss.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

Penalty = Literal["signed", "abs"]


class LagrangeMultipliers(nn.Module):
    """λ1, λ2 ``[K]``, one pair per task category, initialised U[0, 0.5) as the official code."""

    def __init__(self, num_categories: int, generator: torch.Generator | None = None):
        super().__init__()
        self.lambda1 = nn.Parameter(torch.rand(num_categories, generator=generator) * 0.5)
        self.lambda2 = nn.Parameter(torch.rand(num_categories, generator=generator) * 0.5)

    def table(self, categories: list[str]) -> dict[str, dict[str, float]]:
        """``{"lambda1": {category: value}, "lambda2": {...}}`` for logs and checkpoints."""
        return {
            name: dict(zip(categories, getattr(self, name).detach().cpu().tolist())) for name in ("lambda1", "lambda2")
        }


def omega_msr(r: torch.Tensor) -> torch.Tensor:
    """Soft ΩMSR ``[N]`` of straight-through decisions ``r [N, L, H]`` (1 = full side)."""
    return 1 - r.flatten(1).mean(dim=1)


def constraint_gap(
    omega: torch.Tensor, target: torch.Tensor, interval: tuple[float, float] | None = None
) -> torch.Tensor:
    """``D = Ω − t`` ``[N]``; with ``interval=(lo, hi)`` (offsets around ``t``), the signed distance to
    ``[t + lo, t + hi]``."""
    if interval is None:
        return omega - target
    lo, hi = interval
    return torch.clamp(omega - (target + hi), min=0) + torch.clamp(omega - (target + lo), max=0)


def sparsity_penalty(
    omega: torch.Tensor,
    category: torch.Tensor,
    targets: torch.Tensor,
    multipliers: LagrangeMultipliers,
    penalty: Penalty = "signed",
    interval: tuple[float, float] | None = None,
) -> torch.Tensor:
    """Lagrangian term of one micro-batch (a scalar).

    Args:
        omega: ``[N]`` soft ΩMSR of the micro-batch's samples.
        category: ``[N]`` int64 category index of each sample.
        targets: ``[K]`` target ΩMSR per category.
        multipliers: λ1, λ2 ``[K]``.
        penalty: ``"signed"`` (paper) or ``"abs"`` (official).
        interval: optional tolerance interval around the target (extension).
    """
    gap = constraint_gap(omega, targets[category].to(omega.dtype), interval)
    lam1, lam2 = multipliers.lambda1[category], multipliers.lambda2[category]
    linear = gap.abs() if penalty == "abs" else gap
    per_sample = lam1 * linear + lam2 * gap.square()
    present = torch.unique(category)
    return torch.stack([per_sample[category == k].mean() for k in present]).mean()
