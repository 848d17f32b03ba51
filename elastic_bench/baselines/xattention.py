"""XAttention: training-free block-sparse prefill, every head keeping the key blocks its antidiagonal scores select.

Paper: Xu et al., "XAttention: Block Sparse Attention with Antidiagonal Scoring", ICML 2025,
https://arxiv.org/abs/2503.16428, and upstream mit-han-lab/x-attention (``xattn/src/Xattention.py``). The estimation
and selection live in `elastic_bench.kernels.xattention`. Selection is per *query* head and per prompt, with
upstream's block-selection rule by default. τ is flat for every head unless a per-head table is given
(``thresholds=PATH``); upstream's own tables carry no licence and are not shipped. Decode steps attend the whole
cache, as upstream.

Threshold tables: a tab-separated text file, one row per layer a method plans (the full softmax layers, in layer
order) and one column per query head, each
value a τ in [0, 1] (the layout of DuoAttention's gate files, with query heads instead of KV heads). It is a learned
artifact of the run (`XAttention.artifacts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from elastic_bench.foundation.files import read_table
from elastic_bench.kernels import HeadPlan, Mode, xattention_select
from elastic_bench.kernels.xattention import Rule
from elastic_bench.modeling.interface import AttentionCall, Method, SparsityKnob, register_method
from elastic_bench.modeling.tensor_parallel import query_heads

DEFAULT_THRESHOLD = 0.9  # the Elastic paper's τ, and the default of upstream's standalone estimate


def load_thresholds(path: str | Path) -> np.ndarray:
    """Per-head thresholds τ ``[layers, query heads]`` (float64) from a threshold table (module doc).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is empty, not a tab-separated table of numbers, or holds a τ outside [0, 1] (NaN
            included; the message names the first bad layer and query head).
    """
    table = read_table(path, "XAttention threshold table", "thresholds (rows = layers, columns = query heads)")
    bad = np.argwhere(~((table >= 0.0) & (table <= 1.0)))
    if len(bad):
        layer, head = (int(i) for i in bad[0])
        raise ValueError(f"{path} holds τ = {table[layer, head]} at layer {layer}, query head {head}; every "
                         "threshold must lie in [0, 1]")
    return table


@register_method("xattention", "xattn")
@dataclass
class XAttention(Method):
    """All KV heads BLOCK_SPARSE with blocks chosen by XAttention's antidiagonal scores (ΩMSR = 1).

    Args:
        threshold: cumulative-mass threshold τ of every head (0.9 as the Elastic paper and upstream's estimate;
            upstream's ``Xattention_prefill`` defaults to 0.8).
        stride: antidiagonal stride S (16 as Elastic; 8 in some upstream settings).
        block_size: block size (128, as Block-Sparse-Attention).
        thresholds: per-head τ table replacing ``threshold``: a TSV file, rows = layers, columns = query heads.
        rule: block-selection rule, ``upstream`` (upstream's, its first estimation chunk included) or ``strict``
            (block 0 and the diagonal counted in every row); see `elastic_bench.kernels.xattention`.
    """

    threshold: float = DEFAULT_THRESHOLD
    stride: int = 16
    block_size: int = 128
    thresholds: str | None = None
    rule: Rule = "upstream"

    knobs = (SparsityKnob("threshold", "lower", low=0.0, high=1.0),)

    def __post_init__(self):
        if not 0.0 <= self.threshold <= 1.0:  # NaN fails too
            raise ValueError(f"{self.name}.threshold must lie in [0, 1], got {self.threshold}")
        if self.stride < 1:
            raise ValueError(f"{self.name}.stride must be >= 1, got {self.stride}")
        if self.block_size < 1:
            raise ValueError(f"{self.name}.block_size must be >= 1, got {self.block_size}")
        if self.block_size % self.stride:
            raise ValueError(f"{self.name}.stride must divide {self.name}.block_size ({self.block_size}), "
                             f"got {self.stride}")
        if self.thresholds is not None:
            if self.threshold != DEFAULT_THRESHOLD:
                raise ValueError(f"{self.name}: give threshold or thresholds, not both (the table replaces "
                                 f"threshold={self.threshold})")
            load_thresholds(self.thresholds)  # exists and parses, before any model loads
        self._tau: dict[int, torch.Tensor] = {}  # layer_idx -> τ [Hq], set by setup() from `thresholds`

    def artifacts(self, model_dir: str) -> dict[str, Path]:
        return {} if self.thresholds is None else {"thresholds": Path(self.thresholds)}

    def setup(self, model: nn.Module) -> None:
        if self.thresholds is None:
            return
        from elastic_bench.modeling.attention import attention_modules, module_device

        table = load_thresholds(self.thresholds)
        modules = attention_modules(model)
        expected = (len(modules), model.config.num_attention_heads)
        if table.shape != expected:
            raise ValueError(f"{self.name}.thresholds: {self.thresholds} is {table.shape[0]} layers × "
                             f"{table.shape[1]} query heads; the model has {expected[0]} layers × {expected[1]} "
                             "query heads")
        tau = torch.tensor(table, dtype=torch.float32)
        # each layer's τ of the query heads its module holds (this rank's under tensor parallelism), on its device
        self._tau = {m.layer_idx: tau[row, query_heads(m)].to(module_device(m)) for row, m in enumerate(modules)}

    def teardown(self, model: nn.Module) -> None:
        self._tau = {}

    def prefill_plan(self, call: AttentionCall) -> HeadPlan:
        tau = self._tau[call.layer_idx] if self.thresholds is not None else self.threshold
        blocks = xattention_select(call.query, call.key, tau, self.stride, self.block_size, rule=self.rule)
        return HeadPlan.uniform(
            Mode.BLOCK_SPARSE, call.batch_size, call.num_kv_heads, blocks=blocks,  # host modes: no sync
            block_size=self.block_size,
        )
