"""The attention of a gate-training forward: each KV head's output mixes a full and a streaming branch by its gate.

- DuoAttention (``two_way=True``, upstream ``duo_attn/patch/llama.py``, the "two-way" forward): the batch holds the
  same sequence twice; row 0 is the teacher, with full attention on every head and no gradient, row 1 the student,
  whose head ``h`` outputs ``(1 − α_h)·streaming(student) + α_h·full(teacher)``: the full term is the teacher's
  attention output of that layer, so one forward gives both the target and the student.
- PruLong (``two_way=False``, upstream ``prulong/training/modeling_flash_llama.py``): one row; head ``h`` outputs
  ``z_h·full + (1 − z_h)·streaming``, both branches from the same queries, keys and values.

The gates (``α`` or ``z``, ``[L, H]`` per layer and KV head) come with each forward as its ``training_route`` keyword
(a `GateRoute`), which transformers hands to the attention function; a layer recomputed in backward gets the same
one. The streaming branch uses the trainer's geometry (upstream trains with Block-Sparse-Attention's block
streaming); on a compiled backend (``flex``) the differentiable branches run on zero-padded inputs of
`elastic_bench.training.engine.compile_length`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from elastic_bench.kernels import HeadPlan, Mode, StreamingGeometry, hybrid_attention, resolve_backend
from elastic_bench.modeling.interface import AttentionCall, Method


class GateRoute:
    """The gates of one training forward, passed as its ``training_route`` keyword.

    A plain class, not a dataclass: FSDP2 maps over dataclass inputs of a sharded module's forward and would hand the
    layers a copy.

    Attributes:
        gates: ``[L, H]`` gate of each (layer, KV head) over the L layers a method plans
            (`elastic_bench.modeling.attention.attention_modules`, in order: a gate file's rows); values outside
            [0, 1] are clamped in the forward.
    """

    def __init__(self, gates: torch.Tensor):
        self.gates = gates

    def __repr__(self) -> str:
        return f"GateRoute(gates={tuple(self.gates.shape)})"


@dataclass
class GatedHeads(Method):
    """Training-time attention of the gate trainers (not registered: used by `train_duo` and `train_prulong`).

    Args:
        sink, local, granularity: geometry of the streaming branch.
        two_way: DuoAttention's teacher/student batch of two rows; otherwise PruLong's mixing on one row.
    """

    sink: int = 128
    local: int = 256
    granularity: Literal["token", "block"] = "block"
    two_way: bool = False

    def __post_init__(self):
        self.geometry = StreamingGeometry(self.sink, self.local, self.granularity)
        self._row: dict[int, int] = {}  # layer_idx -> its row of the gates, set by setup

    def setup(self, model: torch.nn.Module) -> None:
        from elastic_bench.modeling.attention import attention_modules

        self._row = {m.layer_idx: i for i, m in enumerate(attention_modules(model))}

    def prefill_plan(self, call: AttentionCall) -> HeadPlan:
        return HeadPlan.full(call.batch_size, call.num_kv_heads)  # the branches are planned in `attend`

    def attend(self, call: AttentionCall, plan: HeadPlan, scale: float | None, backend: str) -> torch.Tensor:
        """``[B, Hq, L, D]``: the mixed heads (two-way: row 0 the teacher's full attention, row 1 the student's)."""
        route = call.training_route
        if not isinstance(route, GateRoute):
            raise RuntimeError("a gate-training forward needs a GateRoute as its training_route keyword")
        q, k, v = call.query, call.key, call.value
        gate = route.gates[self._row[call.layer_idx]].clamp(0.0, 1.0)  # [H]
        G = q.shape[1] // k.shape[1]
        gate = gate.repeat_interleave(G)[None, :, None, None].to(q.dtype)  # [1, Hq, 1, 1]
        streaming = HeadPlan.uniform(Mode.STREAMING, 1, k.shape[1], streaming=self.geometry)
        full = HeadPlan.full(1, k.shape[1])
        if self.two_way:
            if call.batch_size != 2:
                raise ValueError(f"DuoAttention's two-way forward takes 2 rows (teacher, student), got "
                                 f"{call.batch_size}")
            with torch.no_grad():
                fast = resolve_backend("auto", q.device, k.shape[2])
                teacher = hybrid_attention(q[:1], k[:1], v[:1], full, scale=scale, backend=fast, sinks=call.sinks)
            student = _branch(q[1:], k[1:], v[1:], streaming, scale, backend, call.sinks)
            return torch.cat([teacher, student + gate * (teacher - student)])
        if call.batch_size != 1:
            raise ValueError(f"PruLong's mixing takes one row per sample, got {call.batch_size}")
        sparse = _branch(q, k, v, streaming, scale, backend, call.sinks)
        dense = _branch(q, k, v, full, scale, backend, call.sinks)
        return sparse + gate * (dense - sparse)


def _branch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: HeadPlan, scale: float | None,
            backend: str, sinks: torch.Tensor | None) -> torch.Tensor:
    """A differentiable branch ``[1, Hq, L, Dv]`` (with the layer's learned ``sinks``, if any); zero-padded to
    `compile_length` on ``flex``."""
    from elastic_bench.training.engine import compile_length

    length = k.shape[2]
    padded = compile_length(length, plan.block_size) if backend == "flex" else length
    if padded > length:
        q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, padded - length)) for x in (q, k, v))
    return hybrid_attention(q, k, v, plan, scale=scale, backend=backend, sinks=sinks)[:, :, :length]
