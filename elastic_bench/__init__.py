"""elastic-bench: evaluate long-context sparse-attention methods on real LLMs; reference Elastic Attention.

Public API (imported lazily so that ``elastic_bench.reports`` and the CLI's help need no torch):
``load_model``, ``apply``, ``methods``, and the subpackages ``kernels``, ``method``, ``tasks``, ``reports``.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "load_model": ("elastic_bench.models", "load_model"),
    "apply": ("elastic_bench.attention", "apply"),
    "methods": ("elastic_bench.methods", None),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'elastic_bench' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = importlib.import_module(module)
    return getattr(value, attr) if attr else value


__all__ = ["__version__", *_LAZY]
