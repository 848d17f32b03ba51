"""Elastic Attention itself: the Attention Router, its relaxation, the Lagrangian objective, training data, the
trainer and router checkpoints (https://arxiv.org/abs/2601.17367; official code ``LCM-Lab/Elastic-Attention``).

The registered ``elastic`` method (`elastic_bench.method.elastic`, the adapter to
`elastic_bench.modeling.interface.Method`)
applies trained routers at inference; `trainer` trains them on `elastic_bench.training.engine`'s engine.

Public API (imported lazily, so the CLI's help needs no torch): `AttentionRouter`, `RouterBank`, `RouterConfig`,
`ModeConfig`, `load_routers`, `save_routers`, `RouterTrainConfig`, `TrainResult`, `train`, `synthetic_records`.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "AttentionRouter": "router",
    "RouterBank": "checkpoint",
    "RouterConfig": "checkpoint",
    "load_routers": "checkpoint",
    "save_routers": "checkpoint",
    "ModeConfig": "modes",
    "RouterTrainConfig": "trainer",
    "TrainResult": "trainer",
    "train": "trainer",
    "synthetic_records": "data",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'elastic_bench.method' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


__all__ = list(_LAZY)
