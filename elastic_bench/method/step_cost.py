"""The FLOPs of one router-training step, for the ceiling its time is held against (docs/benchmarks.md).

Counted as `elastic_bench.modeling.cost` counts a prefill (a multiply-add is 2 FLOPs; softmax, masks, the routers and
the optimizer are not counted), for a frozen backbone whose gradients reach only the routers' decisions:

- **Forward**: ``T · (W + V)`` for ``T`` tokens, ``W`` the weights' FLOPs per token (`CostModel.per_token`) and ``V =
  2 · hidden · vocab`` the LM head, whose logits every token's loss needs; plus both branches of every routed layer:
  per sample of ``L`` tokens, ``(causal(L) + streaming(L)) · Hq · 2 · (D_qk + D_v)``.
- **Backward**: gradients of the activations only (no weight gradients): ``T · (W + V)`` for the weights and 2.5×
  the forward attention (FlashAttention's backward: five matrix products to the forward's two).
- **Recomputation**: the LM head in chunks (always recomputed, `elastic_bench.training.engine.LossModel`), and with
  gradient checkpointing one more forward of the decoder layers.

The ceiling of a step is these FLOPs at the device's dense bf16 peak. Layers no router routes (sliding-window,
linear-attention) count their weights only, and layer 0's attention, whose inputs need no gradient, is counted with a
backward it does not run: an upper bound on the work by at most one layer's attention in ``L``.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from elastic_bench.kernels import StreamingGeometry, causal_pairs
from elastic_bench.kernels.sparsity import streaming_pairs
from elastic_bench.modeling.cost import CostModel
from elastic_bench.modeling.layer_kinds import text_config

ATTENTION_BACKWARD = 2.5  # FlashAttention's backward FLOPs over its forward's


@dataclass(frozen=True)
class StepCost:
    """FLOPs of a router-training step (module doc) of one model and streaming side.

    Attributes:
        weights: ``W``, FLOPs per token through the weights (embeddings and LM head apart).
        head: ``V``, FLOPs per token of the LM head.
        pair: FLOPs of one causal pair in one routed layer, every query head together.
        layers: routed layers.
        geometry, block_size: the streaming branch.
        checkpointing: whether the decoder layers are recomputed in backward.
    """

    weights: float
    head: float
    pair: float
    layers: int
    geometry: StreamingGeometry
    block_size: int
    checkpointing: bool

    @classmethod
    def of(cls, model: nn.Module, layers: int, geometry: StreamingGeometry, block_size: int,
           checkpointing: bool) -> StepCost:
        """The step cost of a loaded transformers causal LM with ``layers`` routed layers."""
        config = text_config(model.config)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        pair = config.num_attention_heads * 2.0 * (2 * head_dim)
        return cls(CostModel.of(model).per_token, 2.0 * config.hidden_size * config.vocab_size, pair, layers,
                   geometry, block_size, checkpointing)

    def row(self, lengths: list[int]) -> float:
        """FLOPs of forward, backward and recomputation of one packed row of samples of ``lengths`` tokens."""
        tokens = sum(lengths)
        attention = self.layers * self.pair * sum(
            causal_pairs(n, n) + streaming_pairs(n, n, self.geometry, self.block_size)[0] for n in lengths)
        forward = tokens * (self.weights + self.head) + attention
        backward = tokens * (self.weights + self.head) + ATTENTION_BACKWARD * attention
        recomputed = tokens * self.head + (tokens * self.weights + attention if self.checkpointing else 0.0)
        return forward + backward + recomputed
