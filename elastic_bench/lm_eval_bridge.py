"""lm-evaluation-harness bridge: lm-eval's tasks on a model running under an elastic-bench method.

Command line: ``elastic-bench lm-eval run --model elastic --model_args
pretrained=testbed,method=streaming,method_local=256 --tasks ...`` (every lm-eval flag works; ``--device`` is lm-eval's
own). Python: ``ElasticLM(pretrained="tiny:qwen3", method="streaming")`` passed to ``lm_eval.simple_evaluate``.
Scores follow lm-eval's protocol (its prompts, truncation and scorers), which differs from the official ones that
``elastic-bench run`` reproduces: label such numbers "lm-eval protocol" (docs/benchmarks.md). Needs the ``lm-eval``
extra.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from elastic_bench.attention import apply
from elastic_bench.interface import get_method
from elastic_bench.models import load_model


@register_model("elastic")
class ElasticLM(HFLM):
    """lm-eval's Hugging Face model with an elastic-bench method applied for the object's lifetime.

    Args:
        pretrained: model spec (``tiny:qwen3``, ``testbed``, a local path or hub id).
        method: registered method name; its knobs are given as ``method_<knob>=value``.
        backend: kernel backend of `hybrid_attention`.
        dtype, device: as `load_model` (``"bfloat16"``, ``"cuda"``, ...).
        **kwargs: the remaining `HFLM` arguments (``batch_size``, ``max_length``, ...).
    """

    def __init__(self, pretrained: str = "tiny:qwen3", method: str = "full", backend: str = "auto",
                 dtype: str | None = None, device: str | None = None, **kwargs: Any):
        knobs = {key.removeprefix("method_"): kwargs.pop(key) for key in list(kwargs) if key.startswith("method_")}
        self.method = get_method(method, **knobs)
        model, tokenizer = load_model(str(pretrained), dtype=getattr(torch, dtype) if dtype else None, device=device)
        self._applied = apply(self.method, model, backend=backend)
        self.handle = self._applied.__enter__()
        super().__init__(pretrained=model, tokenizer=tokenizer, **kwargs)

    def close(self) -> None:
        """Restore the model's own attention."""
        self._applied.__exit__(None, None, None)


def cli(argv: list[str]) -> int:
    """Run lm-eval's command line with the ``elastic`` model registered."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *argv]
    cli_evaluate()
    return 0
