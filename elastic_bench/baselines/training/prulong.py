"""``elastic-bench train-prulong``: PruLong's hard-concrete head masks for any model, on the training engine.

Upstream ``princeton-pli/PruLong`` (``prulong/training/l0.py``, ``modeling_flash_llama.py``, ``lh_trainer.py``,
``run_scripts/prulong_masksonly.sh``, ``save_prulong_masks.py``), re-implemented:

- One ``log α`` per KV head and layer, initialised N(4.0, 0.01) (``reset_masks``); the backbone frozen.
- Every forward samples ``z = hardtanh(1.2·σ((log u − log(1 − u) + log α)/β) − 0.1, 0, 1)``, ``u ~ U(ε, 1 − ε)``,
  β = 2/3 (the hard-concrete distribution stretched to (−0.1, 1.1)); head ``h`` outputs
  ``z_h·full + (1 − z_h)·streaming`` (`GatedHeads`); streaming in training: block streaming, sink 128 + 1024
  (halved for a short context, `fit_window`).
- Loss: the token cross-entropy (on every next token by default, as PruLong's language-modelling objective; or on
  the QA tokens) plus the Lagrangian ``λ1·(s − t) + λ2·(s − t)²``, ``s = 1 − mean(z)`` the sampled sparsity, ``t``
  the target ramped linearly from 0 to ``target`` over the first ``sparsity_warmup`` of the steps; λ1, λ2 start at 0
  and ascend (AdamW ``maximize``).
- AdamW (0.9, 0.95), weight decay 0.1 on masks and λ, mask lr 1.0, λ lr 1.0, cosine schedule with a 10% warm-up
  (from 0, as transformers' scheduler) down to 1% of the peak, gradient-norm clip 1.0; 1000 steps of 16 samples.
- The data: rows of ``max_length`` consecutive tokens of natural text (`PasskeyData.kind` ``text``: the
  ``--haystack`` corpus, RULER's essays or generated sentences), the LM loss on every token, as upstream trains on
  ProLong's packed long documents (131K-token rows); ``kind="passkeys"`` trains on DuoAttention's passkey retrieval
  instead (what this trainer used before; the Elastic paper compares its baselines "under the same environment and
  data").
- Export: the deterministic 0/1 masks at ``target`` sparsity: the ``⌊n·(1 − target)⌋`` heads of largest log α are
  1 (upstream ranks by its deterministic soft mask, which orders heads as log α does except among those it sets to
  0, where it breaks ties at random), in ``full_attention_heads.tsv`` (rows = layers), plus ``log_alpha.tsv``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import nn

from elastic_bench.foundation.files import write_table
from elastic_bench.training.engine import RunOptions, TokenizedExample, all_reduce_sum, autocast, pack, row_inputs

from .base import GateObjective, GateTrainConfig, run_gate_training
from .mixing import GateRoute

STRETCH = (-0.1, 1.1)
BETA = 2 / 3
EPS = 1e-8
LOG_ALPHA_FILE = "log_alpha.tsv"


@dataclass
class PruLongTrainConfig(GateTrainConfig):
    """``elastic-bench train-prulong`` (defaults: upstream's ``run_scripts/prulong_masksonly.sh``).

    Attributes:
        target: the head sparsity the Lagrangian steers to (fraction of streaming KV heads), and the exported masks'.
        sparsity_warmup: fraction of the steps over which the target ramps from 0.
        warmup_type: the ramp: ``linear``, or ``logarithmic`` (linear in log(1 − t)).
        linear_term: keep the Lagrangian's linear term λ1·(s − t) (upstream's --disable_linear_regularization_term
            drops it).
        mask_lr: peak learning rate of the masks' log α.
        lambda_lr: peak learning rate of λ1, λ2 (gradient ascent).
        weight_decay: AdamW weight decay of masks and λ.
        betas: AdamW (β1, β2).
        warmup: fraction of the steps of linear learning-rate warm-up from 0 (then cosine decay).
        min_lr_ratio: the learning rate after the warm-up never falls below this fraction of the peak.
        grad_clip: clip of the total gradient norm over masks and λ.
        init_log_alpha: mean of the initial log α (standard deviation 0.01).
        loss_tokens: the LM loss on ``all`` next tokens of a sample or on the ``answer`` (QA) tokens.
    """

    steps: int = 1000
    batch_size: int = 16
    target: float = 0.7
    sparsity_warmup: float = 0.8
    warmup_type: Literal["linear", "logarithmic"] = "linear"
    linear_term: bool = True
    mask_lr: float = 1.0
    lambda_lr: float = 1.0
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    warmup: float = 0.1
    min_lr_ratio: float = 0.01
    grad_clip: float = 1.0
    init_log_alpha: float = 4.0
    loss_tokens: Literal["all", "answer"] = "all"

    UPSTREAM_WINDOW: ClassVar[tuple[int, int]] = (128, 1024)
    DEFAULT_KIND: ClassVar[str] = "text"

    def __post_init__(self):
        super().__post_init__()
        self.betas = tuple(self.betas)
        checks = {
            "target must lie in [0, 1)": 0.0 <= self.target < 1.0,
            "sparsity_warmup must lie in [0, 1]": 0.0 <= self.sparsity_warmup <= 1.0,
            "warmup must lie in [0, 1)": 0.0 <= self.warmup < 1.0,
            "min_lr_ratio must lie in [0, 1]": 0.0 <= self.min_lr_ratio <= 1.0,
            "mask_lr and lambda_lr must be > 0": self.mask_lr > 0 and self.lambda_lr > 0,
            "grad_clip must be > 0": self.grad_clip > 0,
        }
        failed = [message for message, ok in checks.items() if not ok]
        if failed:
            raise ValueError("; ".join(failed))


# ---- the hard-concrete distribution --------------------------------------------------------------------------------


def sample_z(log_alpha: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """A hard-concrete sample of the shape of ``log_alpha`` from uniform noise ``u`` in (0, 1)."""
    low, high = STRETCH
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / BETA)
    return torch.nn.functional.hardtanh(s * (high - low) + low, 0.0, 1.0)


def prob_zero(log_alpha: torch.Tensor) -> torch.Tensor:
    """``P(z = 0)`` per gate (the stretched distribution's mass at or below 0)."""
    low, high = STRETCH
    x = (0.0 - low) / (high - low)
    return torch.sigmoid(BETA * math.log(x / (1 - x)) - log_alpha).clamp(EPS, 1 - EPS)


def expected_sparsity(log_alpha: torch.Tensor) -> float:
    """The expected fraction of gates at 0."""
    return float(prob_zero(log_alpha.detach()).mean())


def binary_masks(log_alpha: torch.Tensor, sparsity: float) -> np.ndarray:
    """Deterministic 0/1 masks ``[L, H]``: the ``⌊n·(1 − sparsity)⌋`` gates of largest log α are 1."""
    flat = log_alpha.detach().double().cpu().flatten()
    keep = int(flat.numel() * (1 - sparsity))
    masks = torch.zeros_like(flat)
    masks[torch.argsort(flat, descending=True, stable=True)[:keep]] = 1.0
    return masks.view(log_alpha.shape).numpy()


class Masks(nn.Module):
    """``log_alpha [L, H]`` of the masks and the Lagrange multipliers ``lambdas [2]`` (λ1, λ2)."""

    def __init__(self, layers: int, kv_heads: int, init: float, generator: torch.Generator):
        super().__init__()
        self.log_alpha = nn.Parameter(init + 0.01 * torch.randn(layers, kv_heads, generator=generator))
        self.lambdas = nn.Parameter(torch.zeros(2))


class PruLongObjective(GateObjective):
    """PruLong's masked language-modelling objective on the engine (see the module docstring)."""

    command = "train-prulong"
    gate_format = "%d"

    def __init__(self, config: PruLongTrainConfig, output: str, model, samples, device, ranks):
        super().__init__(config, output, model, samples, device, ranks)
        from elastic_bench.modeling.attention import attention_modules
        from elastic_bench.training.engine import LossModel

        gen = torch.Generator().manual_seed(config.seed)
        self.masks = Masks(len(attention_modules(model)), model.config.num_key_value_heads, config.init_log_alpha,
                           gen).to(device)
        self.modules = {"masks": self.masks}
        groups = [{"params": [self.masks.log_alpha], "lr": config.mask_lr, "weight_decay": config.weight_decay},
                  {"params": [self.masks.lambdas], "lr": config.lambda_lr, "weight_decay": config.weight_decay,
                   "maximize": True}]
        self.optimizer = torch.optim.AdamW(groups, betas=config.betas)
        self.batches = samples
        self.clipped = self.replicated = [self.masks.log_alpha, self.masks.lambdas]
        self.grad_clip = config.grad_clip
        self.grad_norms = {"mask": [self.masks.log_alpha]}
        self.root = LossModel(model)

    def learning_rate(self, step: int) -> list[float]:
        factor = lr_factor(step, self.config)
        return [self.config.mask_lr * factor, self.config.lambda_lr * factor]

    def target_at(self, step: int) -> float:
        """The target sparsity of step ``step`` (upstream's ``get_current_target_sparsity``)."""
        config = self.config
        ramp = math.ceil(config.sparsity_warmup * config.steps)
        if step >= ramp:
            return config.target
        if config.warmup_type == "linear":
            return config.target * step / ramp
        return 1 - math.exp(math.log(1 - config.target) * step / ramp)

    def losses(self, step: int, batch) -> Iterator[torch.Tensor]:
        config, masks = self.config, self.masks
        self.began = time.perf_counter()
        self.target = target = self.target_at(step)
        self.tally = tally = torch.zeros(4, dtype=torch.float64)  # lm, penalty, sampled sparsity, samples
        slots = range(self.ranks.rank, config.batch_size, self.ranks.world_size)
        for slot, sample in zip(slots, batch):
            self.handle.reset()
            noise = torch.Generator().manual_seed(((config.seed * 1_000_003 + step) * 1_000_003 + slot) % (1 << 63))
            u = torch.rand(masks.log_alpha.shape, generator=noise, dtype=torch.float64).clamp(EPS, 1 - EPS)
            z = sample_z(masks.log_alpha, u.to(self.device, masks.log_alpha.dtype))
            row = pack([TokenizedExample(sample.input_ids, sample.answer_start, 0)], len(sample.input_ids),
                       config.loss_tokens)[0]
            with autocast(self.device):
                loss_sum, count = self.root(*row_inputs(row, self.device), training_route=GateRoute(z))
            lm = loss_sum / count.clamp(min=1)
            gap = (1 - z.mean()) - target
            penalty = masks.lambdas[1] * gap**2 + (masks.lambdas[0] * gap if config.linear_term else 0.0)
            yield (lm + penalty) / config.batch_size
            values = [lm.detach().item(), penalty.detach().item(), 1 - z.detach().mean().item(), 1.0]
            tally += torch.tensor(values, dtype=torch.float64)

    def record(self, step: int, seconds: float) -> dict[str, Any]:
        tally = self.tally
        if self.ranks.world_size > 1:
            tally = all_reduce_sum(tally, self.device)
        samples = max(1.0, float(tally[3]))
        record = {
            "lr": self.optimizer.param_groups[0]["lr"],
            "lm_loss": float(tally[0]) / samples,
            "penalty": float(tally[1]) / samples,
            "target": self.target,
            "sampled_sparsity": float(tally[2]) / samples,
            "expected_sparsity": expected_sparsity(self.masks.log_alpha),
            "lambda1": float(self.masks.lambdas[0].detach()),
            "lambda2": float(self.masks.lambdas[1].detach()),
        }
        return self.timed(record)

    def postfix(self, record: dict[str, Any]) -> str:
        return (f"lm={record['lm_loss']:.3f} t={record['target']:.2f} E[s]={record['expected_sparsity']:.2f} "
                f"λ=({record['lambda1']:.2f}, {record['lambda2']:.2f})")

    def gates(self) -> np.ndarray:
        return binary_masks(self.masks.log_alpha, self.config.target)

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "expected_sparsity": expected_sparsity(self.masks.log_alpha)}

    def save(self, step: int) -> None:
        super().save(step)
        write_table(Path(self.output) / LOG_ALPHA_FILE, self.masks.log_alpha.detach().double().cpu().numpy())


def lr_factor(step: int, config: PruLongTrainConfig) -> float:
    """transformers' cosine schedule with warm-up (``step / warm`` during it, so the first step's rate is 0), with
    upstream's floor ``min_lr_ratio + f·(1 − min_lr_ratio)`` after the warm-up."""
    warm = math.ceil(config.warmup * config.steps)
    if step < warm:
        return step / max(1, warm)
    progress = (step - warm) / max(1, config.steps - warm)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return config.min_lr_ratio + cosine * (1 - config.min_lr_ratio)


def train_prulong(config: PruLongTrainConfig, options: RunOptions):
    """Train PruLong masks as configured into ``options.output`` (resuming when it holds the same run).

    Returns:
        ``(0/1 masks [L, H] as numpy, the engine's RunResult)``.
    """
    objective, run = run_gate_training(config, PruLongObjective, options)
    return objective.gates(), run
