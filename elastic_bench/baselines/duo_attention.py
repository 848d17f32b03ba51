"""DuoAttention (Xiao et al., ICLR 2025, https://arxiv.org/abs/2410.10819): retrieval heads FULL, streaming heads
sink 64 + window 256, from one learned gate α per KV head (``full_attention_heads.tsv``), binarised by DuoAttention's
quantile rule (`gates.binarize`). Prefill deployments (one-shot, upstream's chunked prefill, its LongBench setting):
see `gates`.
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic_bench.modeling.interface import register_method

from .gates import HeadGates


@register_method("duo_attention", "duo")
@dataclass
class DuoAttention(HeadGates):
    """DuoAttention: retrieval heads FULL, the other KV heads streaming with sink 64 + window 256 (static, from a
    learned gate file). The default prefill is one-shot and sparse from the first token: it measures the sparsity the
    Elastic paper's comparison uses. ``prefill="chunked"`` is upstream's deployment (chunks of 32000 tokens, the
    first dense for every head, so a prompt within one chunk saves nothing); ``prefill="longbench"`` its LongBench
    evaluation (all but the last 50 prompt tokens dense, then one at a time)."""
