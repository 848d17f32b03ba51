"""Dense causal attention for every head: the baseline every other method is compared with."""

from __future__ import annotations

from dataclasses import dataclass

from elastic_bench.kernels import HeadPlan
from elastic_bench.modeling.interface import AttentionCall, Method, register_method


@register_method("full", "dense")
@dataclass
class Full(Method):
    """All heads FULL at prefill and decode (ΩMSR = ΩESR = 0)."""

    def prefill_plan(self, call: AttentionCall) -> HeadPlan:
        return HeadPlan.full(call.batch_size, call.num_kv_heads)  # host modes: no device synchronisation
