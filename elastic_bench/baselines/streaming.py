"""Static streaming attention (StreamingLLM-style sink + local window) on every head.

Paper: Xiao et al., "Efficient Streaming Language Models with Attention Sinks", https://arxiv.org/abs/2309.17453.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from elastic_bench.kernels import HeadPlan, Mode, StreamingGeometry
from elastic_bench.modeling.interface import AttentionCall, Method, SparsityKnob, register_method


@register_method("streaming")
@dataclass
class Streaming(Method):
    """Every KV head keeps the first ``sink`` tokens and a ``local``-token window (the query's own token included).

    Args:
        sink: sink tokens.
        local: window tokens, counting the query itself.
        granularity: ``"token"`` (exact) or ``"block"`` (128-token blocks, Block-Sparse-Attention semantics).
        sparse_decode: also restrict decode steps to sink + window (an extension; upstream decodes densely).
    """

    sink: int = 128
    local: int = 2048
    granularity: Literal["token", "block"] = "token"
    sparse_decode: bool = False

    knobs = (SparsityKnob("local", "lower", low=1, integer=True),)

    def __post_init__(self):
        if self.sink < 0:
            raise ValueError(f"{self.name}.sink must be >= 0, got {self.sink}")
        if self.local < 1:
            raise ValueError(f"{self.name}.local must be >= 1, got {self.local}")
        self.geometry = StreamingGeometry(self.sink, self.local, self.granularity)

    def prefill_plan(self, call: AttentionCall) -> HeadPlan:
        return HeadPlan.uniform(
            Mode.STREAMING, call.batch_size, call.num_kv_heads, streaming=self.geometry  # host modes: no sync
        )

    def decode_plan(self, call: AttentionCall) -> HeadPlan:
        return self.prefill_plan(call) if self.sparse_decode else super().decode_plan(call)
