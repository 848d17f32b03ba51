"""elastic-bench: evaluate long-context sparse-attention methods on real LLMs; reference Elastic Attention.

Public API (imported lazily so that ``elastic_bench.reports`` and the CLI's help need no torch): ``load_model``,
``apply``, ``get_method``, ``method_names``, ``register_method``, ``Method``, ``AttentionCall``, and the subpackages
``kernels``, ``method``, ``tasks``, ``reports``. Importing it has no side effect: lm-eval finds the model ``elastic``
through the ``lm_eval.models`` entry point, or once `elastic_bench.evaluation.lm_eval_bridge` is imported.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "load_model": "elastic_bench.modeling.loading",
    "apply": "elastic_bench.modeling.attention",
    "get_method": "elastic_bench.modeling.interface",
    "method_names": "elastic_bench.modeling.interface",
    "register_method": "elastic_bench.modeling.interface",
    "Method": "elastic_bench.modeling.interface",
    "AttentionCall": "elastic_bench.modeling.interface",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'elastic_bench' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = ["__version__", *_LAZY]
