"""The model's own small operations around attention (norms, the MLP's activation, rotary embeddings) fused by
``torch.compile`` for the decode steps that `elastic_bench.modeling.generation.DecodeGraph` replays.

At batch 1 a decode step runs each layer's norms, activation and rotary embedding on ``[1, 1, hidden]`` tensors:
about 45 kernels per layer (an 8B model: about 1,460 per step), most of them element-wise and shorter than their
scheduling inside a graph replay. Inductor fuses each norm into one kernel, the activation and its product into one,
and the rotary embedding into one per tensor: the step then runs about half as many kernels. Only transformers' code
is compiled: the attention function, the packed cache and the method stay eager, so nothing of a method changes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from elastic_bench.modeling.attention import softmax_modules

# Inductor rounds each intermediate to the dtype eager would have produced, so fused steps give eager's tokens.
_OPTIONS = {"emulate_precision_casts": True}
_ROTARY = "apply_rotary_pos_emb"  # transformers' rotary function, a global of each model family's modeling module
_UNFUSABLE = (nn.Linear, nn.Embedding)  # one kernel each (a GEMM, a gather): nothing to fuse
_COMPILED = "_elastic_bench_compiled_forward"  # a module's compiled forward, made once and kept on the module
_compiled_rotary: dict[object, object] = {}  # a model family's rotary function -> its compiled wrapper


def fusable_modules(model: nn.Module) -> list[nn.Module]:
    """The largest submodules of ``model`` that hold no attention module and have parameters or buffers, except bare
    linear and embedding layers: on Llama each layer's two norms and MLP, the final norm and the rotary embedding; on
    Qwen3 also the query and key norms inside attention."""
    attention = {id(m) for m in softmax_modules(model)}
    holders = {id(model)}  # the modules on the way from the model to an attention module, and those modules
    for name, module in model.named_modules():
        if id(module) in attention:
            parts = name.split(".")
            holders.update(id(model.get_submodule(".".join(parts[:i]))) for i in range(1, len(parts) + 1))
    found = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if id(child) in holders:
                visit(child)
            elif not isinstance(child, _UNFUSABLE) and (
                    next(child.parameters(), None) is not None or next(child.buffers(), None) is not None):
                found.append(child)

    visit(model)
    return found


@contextmanager
def fused_ops(model: nn.Module) -> Iterator[list[nn.Module]]:
    """Inside the block, `fusable_modules` and the model family's rotary function run compiled; on exit the eager
    forwards come back. Yields the compiled modules.

    Compilation happens at a module's first call for each new input shape (dynamo caches it across blocks), so run
    the eager steps that warm a graph inside the block, and prefill outside it: a prefill's shapes would compile
    again and its timing would include the fused operations. The compiled wrappers are made once per module and
    function and kept, so entering the block again (every prompt of a cell) only swaps forwards.
    """
    modules = fusable_modules(model)
    saved = [(m, m.__dict__.get("forward")) for m in modules]
    owners = dict.fromkeys(sys.modules[type(a).__module__] for a in softmax_modules(model))
    rotary = [(owner, getattr(owner, _ROTARY)) for owner in owners if callable(getattr(owner, _ROTARY, None))]
    try:
        for module in modules:
            if _COMPILED not in module.__dict__:
                module.__dict__[_COMPILED] = torch.compile(module.forward, options=_OPTIONS)
            module.forward = module.__dict__[_COMPILED]
        for owner, function in rotary:
            if function not in _compiled_rotary:
                _compiled_rotary[function] = torch.compile(function, options=_OPTIONS)
            setattr(owner, _ROTARY, _compiled_rotary[function])
        yield modules
    finally:
        for module, forward in saved:
            if forward is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = forward
        for owner, function in rotary:
            setattr(owner, _ROTARY, function)
