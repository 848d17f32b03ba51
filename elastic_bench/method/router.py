"""The Attention Router of Elastic Attention: one small MLP per layer that sends each KV head to FULL or sparse.

Paper: "Elastic Attention: Test-time Adaptive Sparsity Ratios for Efficient Transformers",
https://arxiv.org/abs/2601.17367, §3.1 and App. D.1; official code ``LCM-Lab/Elastic-Attention``.

Design decisions:
- Input: the layer's own key states before RoPE, one ``D``-vector per token and KV head (captured by a hook; see
  `elastic_bench.modeling.attention`). Pooling is the mean of the first and the last ``pool_tokens`` (100) keys,
  computed as
  ``mean(concat(k[:100], k[-100:]))`` so that for prompts shorter than 200 tokens the overlapping keys count twice,
  exactly as the official inference code. The same pooling is used in training and inference; ``pooling="mean"``
  pools the whole prompt instead.
- Two MLPs shared by all KV heads of the layer (no cross-head mixing, no head embedding, every Linear with a bias):
  the task MLP ``cls_feat_extractor`` (D → mD → D) and the router MLP ``cls_router_head_agnostic``
  (D → mD → D → 2), SiLU between, m = 4. The attribute names match the released checkpoints.
- Output: 2 logits per KV head. **Index 1 means the full side (FULL, or XAttention in XA-SSA), index 0 the sparse
  side**, as in the official code and the released checkpoints (the paper's Eq. 6 words it the other way round).
- ``num_logits=1`` is the Gumbel-sigmoid variant of App. F: a single logit per head, > 0 meaning the full side
  (without the official code's LayerNorm of the logits across heads; released checkpoints use 2 logits).
- Initialisation: Linear weights ~ N(0, 0.02), biases 0 (the "neutral initialisation" of the paper).
- Parameters stay in float32; the pooled keys are cast to float32 (autocast may still run the Linears in bf16).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

Pooling = Literal["boundary", "mean"]
FULL_INDEX = 1  # router logit index of the full side; index 0 is the sparse side


class AttentionRouter(nn.Module):
    """Per-layer Attention Router: pooled pre-RoPE keys ``[B, H, D]`` → logits ``[B, H, 2]``.

    Args:
        head_dim: ``D``, the model's head dimension.
        hidden_mult: hidden width multiplier ``m`` of both MLPs (4 in the paper; Table 3 ablates 2/4/6/8).
        num_logits: 2 (softmax router, the default and the released checkpoints) or 1 (Gumbel-sigmoid, App. F).
        pooling: ``"boundary"`` (first and last ``pool_tokens`` keys) or ``"mean"`` (all keys).
        pool_tokens: boundary size for ``"boundary"`` pooling.
        num_kv_heads: ``H`` when the pooled keys are centred (an elastic-bench extension, not in the paper or the
            released checkpoints): a fixed buffer ``feature_mean [H, D]`` is subtracted from them before the MLPs.

    Parameter count ``2·(2·m·D² + m·D + D) + 2·D + 2``: 263,682 at D = 128, m = 4.
    """

    def __init__(
        self,
        head_dim: int,
        hidden_mult: int = 4,
        num_logits: Literal[1, 2] = 2,
        pooling: Pooling = "boundary",
        pool_tokens: int = 100,
        num_kv_heads: int | None = None,
    ):
        super().__init__()
        if num_logits not in (1, 2):
            raise ValueError(f"num_logits must be 1 (sigmoid) or 2 (softmax), got {num_logits}")
        if pooling not in ("boundary", "mean"):
            raise ValueError(f"pooling must be 'boundary' or 'mean', got {pooling!r}")
        d, hidden = head_dim, hidden_mult * head_dim
        self.head_dim, self.num_logits, self.pooling, self.pool_tokens = head_dim, num_logits, pooling, pool_tokens
        self.cls_feat_extractor = nn.Sequential(nn.Linear(d, hidden), nn.SiLU(), nn.Linear(hidden, d))
        self.cls_router_head_agnostic = nn.Sequential(
            nn.Linear(d, hidden), nn.SiLU(), nn.Linear(hidden, d), nn.SiLU(), nn.Linear(d, num_logits)
        )
        if num_kv_heads is not None:
            # Set by the trainer from its prompts and saved with the weights. Without it a head's pooled keys are
            # mostly a component shared by all prompts; what tells tasks apart is a small part, and the shared MLP
            # learns to route every prompt alike before it learns that part.
            self.register_buffer("feature_mean", torch.zeros(num_kv_heads, head_dim))
        else:
            self.feature_mean = None
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Weights ~ N(0, 0.02), biases 0."""
        for layer in self.modules():
            if isinstance(layer, nn.Linear):
                with torch.no_grad():
                    layer.weight.normal_(0.0, 0.02, generator=generator)
                    layer.bias.zero_()

    def pool(self, keys: torch.Tensor, pooling: Pooling | None = None) -> torch.Tensor:
        """Pool pre-RoPE keys ``[B, H, S, D]`` over tokens → ``[B, H, D]`` (float32); ``pooling`` overrides the
        router's own."""
        if keys.dim() != 4 or keys.shape[-1] != self.head_dim:
            raise ValueError(f"router expects keys [B, H, S, {self.head_dim}], got {tuple(keys.shape)}")
        if (pooling or self.pooling) == "boundary":
            n = self.pool_tokens
            keys = torch.cat([keys[:, :, :n], keys[:, :, -n:]], dim=2)
        return keys.float().mean(dim=2)

    def pool_weights(self, prompt_len: int, pooling: Pooling | None = None) -> tuple[int, int, float]:
        """How `pool` weighs a prompt of ``prompt_len`` keys: ``(first, last, weight)``: its first ``first`` and last
        ``last`` keys (overlapping where the prompt is short) each count ``weight``, the pooled key being their
        weighted sum."""
        if (pooling or self.pooling) == "boundary":
            n = min(self.pool_tokens, prompt_len)
            return n, n, 1.0 / (2 * n)
        return prompt_len, 0, 1.0 / prompt_len

    def forward(self, keys: torch.Tensor, pooling: Pooling | None = None) -> torch.Tensor:
        """Logits ``[B, H, num_logits]`` for the pre-RoPE keys ``[B, H, S, D]`` of each prompt."""
        return self.classify(self.pool(keys, pooling))

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, H, num_logits]`` of pooled keys ``[B, H, D]`` (float32; `pool`'s)."""
        if self.feature_mean is not None:
            pooled = pooled - self.feature_mean
        return self.cls_router_head_agnostic(self.cls_feat_extractor(pooled))

    @staticmethod
    def decide(logits: torch.Tensor, margin: float = 0.0) -> torch.Tensor:
        """Deterministic inference decision ``[B, H]`` (bool, True = full side) from logits ``[B, H, 1 or 2]``: the
        full side where its logit exceeds the sparse side's by more than ``margin`` (one logit: where it exceeds
        ``margin``); ``margin`` 0 is the argmax (a tie goes to the sparse side)."""
        if logits.shape[-1] == 1:
            return logits[..., 0] > margin
        return logits[..., FULL_INDEX] - logits[..., 1 - FULL_INDEX] > margin
