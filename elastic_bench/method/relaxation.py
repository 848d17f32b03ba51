"""Differentiable routing decisions: Gumbel-softmax / Gumbel-sigmoid with the straight-through estimator, and the
temperature schedules.

Paper: https://arxiv.org/abs/2601.17367 §3.2 (Gumbel-softmax, STE, Eq. 14) and App. F (Gumbel-sigmoid); official
training code (``LCM-Lab/Elastic-Attention`` @ c62a0fe, ``elasticattn/``): ``training/modeling_flash_qwen.py:899-941``
and ``training/lh_trainer.py:465-521``.

Design decisions:
- The Gumbel noise is an input, not drawn inside: the trainer draws it per (step, sample) from a seeded generator, so
  a recomputed forward (gradient checkpointing) and every data-parallel rank see the same noise as one process would.
- ``r`` is 1 for the full side in the forward pass (hard), with the gradient of the relaxed probability (straight
  through): ``r = hard + p - stopgrad(p)``.
- Temperature: the paper's exponential decay with ``p`` = fraction of training done (an interpretation: the paper
  gives neither the endpoints nor the unit of ``p``) is the default; ``"cosine"`` is the official schedule.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

TauSchedule = Literal["exponential", "cosine"]
EPS = 1e-8


def gumbel_noise(shape: tuple[int, ...], generator: torch.Generator | None = None) -> torch.Tensor:
    """Standard Gumbel noise ``g = -log(-log(u + ε) + ε)``, ``u ~ U(0, 1)``, float32 on the CPU."""
    u = torch.rand(shape, generator=generator)
    return -torch.log(-torch.log(u + EPS) + EPS)


def gumbel_softmax_ste(logits: torch.Tensor, noise: torch.Tensor, tau: float) -> torch.Tensor:
    """Straight-through Gumbel-softmax over 2 classes; returns ``r [...]`` in {0, 1}, 1 = class 1 (full side).

    Args:
        logits: ``[..., 2]`` router logits.
        noise: ``[..., 2]`` Gumbel noise (`gumbel_noise`); zeros give the noiseless relaxation.
        tau: temperature.
    """
    p = torch.softmax((logits.float() + noise) / tau, dim=-1)
    hard = torch.nn.functional.one_hot(p.argmax(dim=-1), 2).to(p.dtype)
    return (hard + (p - p.detach()))[..., 1]  # exactly hard in the forward pass


def gumbel_sigmoid_ste(logits: torch.Tensor, noise: torch.Tensor, tau: float) -> torch.Tensor:
    """Straight-through Gumbel-sigmoid (App. F, Eqs. 12-13); returns ``r [...]`` in {0, 1}, 1 = full side.

    Args:
        logits: ``[..., 1]`` router logits.
        noise: ``[..., 2]`` Gumbel noise; ``g1 - g0`` is the logistic noise of the binary relaxation.
        tau: temperature.
    """
    p = torch.sigmoid((logits.float()[..., 0] + noise[..., 1] - noise[..., 0]) / tau)
    return (p > 0.5).to(p.dtype) + (p - p.detach())


def relax(logits: torch.Tensor, noise: torch.Tensor, tau: float) -> torch.Tensor:
    """The straight-through decision ``r [...]`` of a 2-logit (softmax) or 1-logit (sigmoid) router."""
    if logits.shape[-1] == 2:
        return gumbel_softmax_ste(logits, noise, tau)
    return gumbel_sigmoid_ste(logits, noise, tau)


def temperature(
    step: int,
    max_steps: int,
    schedule: TauSchedule = "exponential",
    tau_init: float = 1.5,
    tau_min: float = 1.0,
    rate: float = 0.6,
    horizon: float = 0.6,
) -> float:
    """Gumbel temperature at optimizer step ``step`` (0-based) of ``max_steps``.

    - ``"exponential"`` (paper Eq. 14): ``max(tau_min, tau_init · exp(-rate · step / max_steps))``.
    - ``"cosine"`` (official): ``tau_min + (tau_init - tau_min)/2 · (1 + cos(π · step / H))`` for
      ``step < H = ceil(horizon · max_steps)``, then ``tau_min``.
    """
    if schedule == "exponential":
        return max(tau_min, tau_init * math.exp(-rate * step / max_steps))
    if schedule == "cosine":
        horizon_steps = math.ceil(horizon * max_steps)
        if step >= horizon_steps:
            return tau_min
        return tau_min + 0.5 * (tau_init - tau_min) * (1 + math.cos(math.pi * step / horizon_steps))
    raise ValueError(f"tau schedule must be 'exponential' or 'cosine', got {schedule!r}")
