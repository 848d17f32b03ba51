"""Retrieval heads of the testbed model, found by ablation: the static head gates DuoAttention and PruLong need.

No DuoAttention or PruLong optimisation has been run on the testbed. Instead, each KV head alone is switched to
streaming attention (every other head stays full) and the drop of exact match on ``niah_single`` (the sensitive task
the shipped model solves) is its gate: 1 for a head the task cannot do without, 0 for one it never needs. The gates
are written in DuoAttention's layout (a TSV of ``layers × KV heads``), so ``-O duo_attention.pattern=FILE`` and
``-O prulong.pattern=FILE`` use them. This is the ablation view of retrieval heads (Wu et al., "Retrieval Head
Mechanistically Explains Long-Context Factuality", https://arxiv.org/abs/2404.15574), not DuoAttention's gate training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from elastic_bench.kernels import HeadPlan, Mode, StreamingGeometry
from elastic_bench.methods import AttentionCall, Method

from .evaluate import exact_match
from .vocab import Vocab


@dataclass
class OneHeadStreaming(Method):
    """KV head ``head`` of layer ``layer`` streams (sink + window); every other head is full. Not registered."""

    layer: int = 0
    head: int = 0
    sink: int = 16
    local: int = 256

    def prefill_plan(self, call: AttentionCall) -> HeadPlan:
        modes = torch.full((call.batch_size, call.num_kv_heads), int(Mode.FULL), dtype=torch.uint8)
        if call.layer_idx == self.layer:
            modes[:, self.head] = int(Mode.STREAMING)
        return HeadPlan(modes.to(call.query.device), StreamingGeometry(self.sink, self.local))


def ablation_gates(model, vocab: Vocab, length: int = 2048, samples: int = 20,
                   tasks: tuple[str, ...] = ("niah_single", "niah_multikey"), progress: bool = True) -> np.ndarray:
    """``[layers, KV heads]`` gates in [0, 1]: the largest relative drop of exact match at ``length`` tokens over
    ``tasks`` (`generators.SPECS` names; by default the sensitive family) when that head alone streams (sink 16,
    window 256). Tasks the model fails with full attention are left out.

    Raises:
        ValueError: the model solves none of ``tasks`` with full attention.
    """
    from elastic_bench.attention import apply

    def scores() -> dict[str, float]:
        found = exact_match(model, vocab, [length], samples, tasks=list(tasks))
        return {task: per_length[str(length)] for task, per_length in found.items()}

    full = {task: score for task, score in scores().items() if score > 0}
    if not full:
        raise ValueError(f"the model solves none of {list(tasks)} with full attention; no head is a retrieval head")
    config = model.config
    gates = np.zeros((config.num_hidden_layers, config.num_key_value_heads))
    cells = [(layer, head) for layer in range(gates.shape[0]) for head in range(gates.shape[1])]
    for layer, head in tqdm(cells, desc="head ablation", disable=not progress):
        with apply(OneHeadStreaming(layer, head), model, backend="reference"):
            ablated = scores()
        gates[layer, head] = max(max(0.0, full[t] - ablated[t]) / full[t] for t in full)
    return gates


def write_gates(gates: np.ndarray, path: str | Path) -> None:
    """Write ``gates [layers, KV heads]`` as DuoAttention's tab-separated ``full_attention_heads.tsv`` layout."""
    np.savetxt(path, gates, delimiter="\t", fmt="%.4f")
