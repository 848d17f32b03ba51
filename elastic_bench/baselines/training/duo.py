"""``elastic-bench train-duo``: DuoAttention's retrieval-head gates for any model, on the training engine.

Upstream ``mit-han-lab/duo-attention`` (``duo_attn/train.py``, ``scripts/train.sh``), re-implemented:

- One gate α per KV head and layer (initialised to 1), the backbone frozen.
- Each step's forward is the two-way batch of `GatedHeads`: row 0 the teacher (full attention), row 1 the student,
  whose heads output ``α·full(teacher) + (1 − α)·streaming(student)``; streaming in training is upstream's block
  streaming, sink 128 + 256 (1 sink block, 2 local blocks; halved for a short context, `fit_window`).
- Loss: the mean over the QA tokens of the per-token mean over channels of (h_teacher − h_student)², h = the final
  (normed) hidden states, plus ``reg_weight · mean(|α|)``; α is clamped to [0, 1] after every step.
- The gates are bf16 parameters, as upstream's (``gate_dtype``; fp32 an option), so AdamW steps in bf16.
- AdamW, lr 0.02, no weight decay, no gradient clipping; the learning rate is ``lr · min(1, max((s + 1)/(N/5), 0.1),
  max((N − s)/(N/5), 0.1))`` (a 20% ramp from a 0.1 floor, flat, a 20% decay to the floor); 2000 steps of one
  sample; data: 10 passkeys of 32 words at 1,000–32,000 tokens (`PasskeyData`; fewer, shorter or longer where the
  model's positions and tokenizer need it, `fit_passkeys`).
- Not reproduced: Ulysses sequence parallelism (upstream trains a 7B model on 8 GPUs at 32K–128K tokens); here one
  process, or ``torchrun`` data parallelism with FSDP2 over the backbone (``batch_size`` a multiple of the ranks).

Output: ``full_attention_heads.tsv`` (raw α in [0, 1], ``numpy.savetxt`` as upstream) and ``config.json``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import nn

from elastic_bench.kernels import torch_dtype
from elastic_bench.training.engine import RunOptions, all_reduce_sum, autocast

from .base import GateObjective, GateTrainConfig, run_gate_training
from .mixing import GateRoute


@dataclass
class DuoTrainConfig(GateTrainConfig):
    """``elastic-bench train-duo`` (defaults: upstream's ``scripts/train.sh``).

    Attributes:
        lr: AdamW learning rate of the gates.
        reg_weight: weight of the L1 term ``mean(|α|)``.
        initial_value: every gate's value at step 0.
        gate_dtype: dtype of the gates and their optimizer state: ``bfloat16``, as upstream trains them (parameters of
            its bf16 model: every value of its released TSVs is bf16-exact, so ties and the order of the heads near a
            sparsity cut are bf16's), or ``float32``.
    """

    lr: float = 0.02
    reg_weight: float = 0.05
    initial_value: float = 1.0
    gate_dtype: Literal["bfloat16", "float32"] = "bfloat16"

    UPSTREAM_WINDOW: ClassVar[tuple[int, int]] = (128, 256)
    DEFAULT_KIND: ClassVar[str] = "passkeys"

    def __post_init__(self):
        super().__post_init__()
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not self.reg_weight >= 0:
            raise ValueError(f"reg_weight must be >= 0, got {self.reg_weight}")
        if not 0.0 <= self.initial_value <= 1.0:
            raise ValueError(f"initial_value must lie in [0, 1], got {self.initial_value}")


class Gates(nn.Module):
    """``alpha [L, H]``: one gate per (layer, KV head), of ``dtype``."""

    def __init__(self, layers: int, kv_heads: int, value: float, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((layers, kv_heads), float(value), dtype=dtype))


class TwoWay(nn.Module):
    """The model's final hidden states for the teacher and the student copy of one sequence; the FSDP2 root under
    ``torchrun``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, route: GateRoute) -> torch.Tensor:
        """``input_ids [T]`` → ``[2, T, hidden]`` (row 0 the teacher's)."""
        ids = input_ids[None].expand(2, -1)
        positions = torch.arange(len(input_ids), device=input_ids.device)[None].expand(2, -1)
        return self.model.base_model(input_ids=ids, position_ids=positions, use_cache=False,
                                     training_route=route).last_hidden_state


def lr_factor(step: int, steps: int) -> float:
    """Upstream's LambdaLR: ``min(1, max((s + 1)/(N // 5), 0.1), max((N − s)/(N // 5), 0.1))``."""
    ramp = max(1, steps // 5)
    return min(1.0, max((step + 1) / ramp, 0.1), max((steps - step) / ramp, 0.1))


class DuoObjective(GateObjective):
    """DuoAttention's distillation objective on the engine (see the module docstring)."""

    command = "train-duo"
    two_way = True

    def __init__(self, config: DuoTrainConfig, output: str, model, samples, device, ranks):
        super().__init__(config, output, model, samples, device, ranks)
        from elastic_bench.modeling.attention import attention_modules

        layers = len(attention_modules(model))
        self.gate_module = Gates(layers, model.config.num_key_value_heads, config.initial_value,
                                 torch_dtype(config.gate_dtype)).to(device)
        alpha = self.gate_module.alpha
        self.modules = {"gates": self.gate_module}
        self.optimizer = torch.optim.AdamW([alpha], lr=config.lr, weight_decay=0.0)
        self.batches = samples
        self.clipped = self.replicated = [alpha]
        self.grad_clip = math.inf  # upstream does not clip
        self.root = TwoWay(model)

    def learning_rate(self, step: int) -> float:
        return self.config.lr * lr_factor(step, self.config.steps)

    def losses(self, step: int, batch) -> Iterator[torch.Tensor]:
        config, alpha = self.config, self.gate_module.alpha
        self.began = time.perf_counter()
        self.tally = tally = torch.zeros(4, dtype=torch.float64)  # distill, reg, samples, tokens
        for sample in batch:
            self.handle.reset()
            ids = sample.input_ids.to(self.device)
            with autocast(self.device):
                hidden = self.root(ids, GateRoute(alpha))
            mask = sample.answer_mask().to(self.device)
            distill = (hidden[0][mask].float() - hidden[1][mask].float()).pow(2).mean(-1).mean()
            reg = alpha.abs().mean()
            yield (distill + config.reg_weight * reg) / config.batch_size
            values = [distill.detach().item(), reg.detach().item(), 1.0, len(ids)]
            tally += torch.tensor(values, dtype=torch.float64)

    def after_step(self, step: int) -> None:
        with torch.no_grad():
            self.gate_module.alpha.clamp_(0.0, 1.0)

    def record(self, step: int, seconds: float) -> dict[str, Any]:
        tally = self.tally
        if self.ranks.world_size > 1:
            tally = all_reduce_sum(tally, self.device)
        samples = max(1.0, float(tally[2]))
        alpha = self.gate_module.alpha.detach()
        record = {
            "lr": self.optimizer.param_groups[0]["lr"],
            "distill_loss": float(tally[0]) / samples,
            "reg_loss": float(tally[1]) / samples,
            "tokens": int(tally[3]),
            "alpha_mean": float(alpha.mean()),
            "alpha_above_half": float((alpha > 0.5).float().mean()),
        }
        return self.timed(record)

    def postfix(self, record: dict[str, Any]) -> str:
        return (f"distill={record['distill_loss']:.4f} reg={record['reg_loss']:.3f} "
                f"α>0.5: {record['alpha_above_half']:.2f}")

    def gates(self) -> np.ndarray:
        return self.gate_module.alpha.detach().clamp(0.0, 1.0).double().cpu().numpy()


def train_duo(config: DuoTrainConfig, options: RunOptions):
    """Train DuoAttention gates as configured into ``options.output`` (resuming when it holds the same run).

    Returns:
        ``(gates [L, H] as numpy, the engine's RunResult)``.
    """
    objective, run = run_gate_training(config, DuoObjective, options)
    return objective.gates(), run
