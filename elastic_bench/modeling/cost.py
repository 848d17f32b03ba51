"""The FLOPs of one prefill, per layer kind, and the speed ceiling they give a sparse-attention method.

The cost model (a multiply-add counts 2 FLOPs) of a prefill of ``T`` tokens:
- **What no attention method shortens**, ``T · per_token + per_prompt``: every weight matrix a token goes through,
  ``2 · P`` per token, with ``P`` the model's parameters but its embeddings, an MoE layer's experts counted at the
  share the router activates (``num_experts_per_tok / experts``; shared experts in full); each linear-attention layer's
  recurrence (Gated DeltaNet: per token and value head ``4·d_k·d_v`` for the state's update and read-out and
  ``2·C·(d_k + d_v)`` within its chunk of ``C = 64`` tokens); and the LM head for the last token only
  (``per_prompt``), as a prefill keeps one row of logits.
- **Attention**, per softmax layer: ``2·(D_qk + D_v)`` per causal pair and query head (scores, then weighted values),
  over the pairs the layer computes: every causal pair of a full layer, those inside the window of a sliding one.
  Softmax, masks and routing are not counted.

The ceiling of a method is the FLOPs of the model's own attention (routed layers dense, window layers as they are)
over those of the method's (the pairs its plans keep), the rest of the prefill unchanged: the speedup a method
would reach if time followed FLOPs, the Amdahl bound of the model, not of the kernel. Counted per prompt from the
plans (`elastic_bench.kernels.SparsityMeter`).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from elastic_bench.modeling.layer_kinds import layer_kinds, text_config

DELTA_CHUNK = 64  # the chunk of the chunked gated delta rule (transformers' and flash-linear-attention's)
EXPERT_COUNTS = ("num_experts", "n_routed_experts", "num_local_experts")  # a config's routed experts, by family


@dataclass(frozen=True)
class CostModel:
    """The FLOPs of a prefill that no attention method changes (module doc).

    Attributes:
        per_token: FLOPs per prompt token: weights (active parameters) and linear-attention recurrences.
        per_prompt: FLOPs once per prompt: the LM head's row of the last token.
    """

    per_token: float
    per_prompt: float

    @classmethod
    def of(cls, model: nn.Module) -> CostModel:
        """The cost model of a loaded transformers causal LM (its parameters and config)."""
        config = text_config(model.config)
        embeddings = {id(p) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
                      for p in m.parameters()}
        share = active_expert_share(config)
        experts = {id(p) for name, m in model.named_modules() if name.rsplit(".", 1)[-1] == "experts"
                   for p in m.parameters()}
        active = sum(p.numel() * (share if id(p) in experts else 1.0) for p in model.parameters()
                     if id(p) not in embeddings)
        recurrent = sum(recurrence_flops(config) for kind in layer_kinds(config) if kind.kind == "linear")
        return cls(2.0 * active + recurrent, 2.0 * config.hidden_size * config.vocab_size)

    def rest(self, tokens: int) -> float:
        """FLOPs of a ``tokens``-token prefill outside the attention of its softmax layers."""
        return tokens * self.per_token + self.per_prompt

    def ceiling(self, tokens: int, attention_full: float, attention_share: float) -> float:
        """The speed ceiling of a prefill of ``tokens`` tokens whose softmax attention costs ``attention_full`` FLOPs
        under the model's own pattern and the share ``attention_share`` of it under the method's plans."""
        rest = self.rest(tokens)
        return (rest + attention_full) / (rest + attention_full * attention_share)


def active_expert_share(config) -> float:
    """The share of a routed-expert set each token goes through (``num_experts_per_tok / experts``; 1 without
    experts)."""
    experts = next((getattr(config, n) for n in EXPERT_COUNTS if getattr(config, n, None)), None)
    top = getattr(config, "num_experts_per_tok", None)
    return top / experts if experts and top else 1.0


def recurrence_flops(config) -> float:
    """FLOPs per token of one Gated DeltaNet layer's recurrence (its projections are weights, counted apart)."""
    heads, dk, dv = (config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim)
    return heads * (4.0 * dk * dv + 2.0 * DELTA_CHUNK * (dk + dv))


def pair_flops(query_heads: int, kv_heads: int, key_dim: int, value_dim: int) -> float:
    """FLOPs of one causal pair of one KV head: ``2·(D_qk + D_v)`` for each of its query heads."""
    return query_heads // kv_heads * 2.0 * (key_dim + value_dim)
