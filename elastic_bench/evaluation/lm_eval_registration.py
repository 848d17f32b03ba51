"""Register lm-eval's model ``elastic`` when lm-eval loads, without importing lm-eval (or torch) here.

``import elastic_bench`` calls `register_when_lm_eval_loads`: lm-eval's Python API then knows ``elastic``
(``lm_eval.simple_evaluate(model="elastic", ...)``) whichever of the two is imported first. The entry is lm-eval's
lazy ``"module:Class"`` placeholder, so `elastic_bench.evaluation.lm_eval_bridge` (torch, transformers) loads only when
a run
asks for the model. lm-eval releases that discover plugins read the ``lm_eval.models`` entry point instead
(``pyproject.toml``).
"""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder
from importlib.util import find_spec

MODEL_NAME = "elastic"
TARGET = "elastic_bench.evaluation.lm_eval_bridge:ElasticLM"
MODEL_TABLE = "lm_eval.models"  # the module whose import registers lm-eval's own models


def register_when_lm_eval_loads() -> None:
    """Register ``elastic`` now if lm-eval's model table is loaded, else right after it loads (an import hook that
    removes itself once it has fired)."""
    if MODEL_TABLE in sys.modules:
        _register()
    elif not any(isinstance(finder, _AfterModelTable) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterModelTable())


def _register() -> None:
    registry = sys.modules["lm_eval.api.registry"].model_registry
    if MODEL_NAME not in registry:
        registry.register(MODEL_NAME, target=TARGET)


class _AfterModelTable(MetaPathFinder):
    """Finds ``lm_eval.models`` as usual and registers ``elastic`` once that module has run."""

    def find_spec(self, name, path=None, target=None):
        if name != MODEL_TABLE:
            return None
        sys.meta_path.remove(self)
        spec = find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _register()

        spec.loader.exec_module = exec_module
        return spec
