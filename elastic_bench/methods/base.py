"""The method interface: a sparse-attention method is a small dataclass that turns one attention call into a HeadPlan.

Design decisions (after kvpress' presses):
- A method owns its knobs as dataclass fields; ``methods.get(name, **kwargs)`` builds one and rejects unknown knobs.
- ``setup(model)`` attaches learned state (routers, gates) and loads artifacts; ``teardown(model)`` removes it.
- ``plan(call)`` is called by the attention glue for every layer of every forward; `AttentionCall.phase` says whether
  it is the one-shot prefill, a later prefill chunk, or a decode step. Decode steps attend the whole cache by
  default (`Method.decode_plan`), as the upstream methods do.
- Learned artifacts are files the method loads, never code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from elastic_bench.kernels import HeadPlan, hybrid_attention
from elastic_bench.registry import Registry, UnknownNameError, did_you_mean

Phase = Literal["prefill", "chunk", "decode"]


@dataclass
class AttentionCall:
    """One attention call of one layer, as the glue hands it to `Method.plan`.

    Attributes:
        module: the model's attention module (``layer_idx``, ``config``, anything a method attached in ``setup``).
        query: ``[B, Hq, Lq, D]`` post-RoPE queries.
        key, value: ``[B, H, Lk, D]`` post-RoPE keys/values, cache included, not repeated for GQA.
        pre_rope_keys: ``[B, H, Lq, D]`` keys of the current tokens before RoPE (after ``k_norm`` where the model has
            one), or None unless the method sets ``needs_pre_rope_keys``.
        sample_ids: index of each batch row among the samples of the current forward (rows of a padded or packed
            batch are planned one sample at a time).
    """

    module: nn.Module
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    pre_rope_keys: torch.Tensor | None = None
    sample_ids: list[int] | None = None

    @property
    def layer_idx(self) -> int:
        return self.module.layer_idx

    @property
    def phase(self) -> Phase:
        q_len, k_len = self.query.shape[2], self.key.shape[2]
        if q_len == k_len:
            return "prefill"
        return "decode" if q_len == 1 else "chunk"

    @property
    def batch_size(self) -> int:
        return self.query.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.key.shape[1]


@dataclass
class Method:
    """Base class of every method. Subclasses are dataclasses registered with ``@register("name")``."""

    name: ClassVar[str] = ""
    needs_pre_rope_keys: ClassVar[bool] = False

    def setup(self, model: nn.Module) -> None:
        """Attach learned state to ``model`` and load artifacts. Called on entering `elastic_bench.apply`."""

    def teardown(self, model: nn.Module) -> None:
        """Undo `setup`. Called on leaving `elastic_bench.apply`, also after an error."""

    def plan(self, call: AttentionCall) -> HeadPlan:
        """The plan of one attention call; dispatches on ``call.phase``."""
        if call.phase == "decode":
            return self.decode_plan(call)
        return self.prefill_plan(call)

    def prefill_plan(self, call: AttentionCall) -> HeadPlan:
        """The plan for a prefill (one-shot, or a chunk after earlier chunks)."""
        raise NotImplementedError

    def decode_plan(self, call: AttentionCall) -> HeadPlan:
        """Decode steps attend the whole KV cache (no decode-time sparsity, as upstream)."""
        return HeadPlan.full(call.batch_size, call.num_kv_heads, device=call.query.device)

    def attend(self, call: AttentionCall, plan: HeadPlan, scale: float | None, backend: str) -> torch.Tensor:
        """Compute the call's attention ``[B, Hq, Lq, D]`` under ``plan``. Methods that train (e.g. mixing a FULL and
        a sparse branch per head) override this; inference methods keep the default."""
        return hybrid_attention(call.query, call.key, call.value, plan, scale=scale, backend=backend)

    def extra_stats(self) -> dict[str, Any]:
        """Method-specific statistics merged into `MethodHandle.stats` (e.g. realised sparsity of a gate file)."""
        return {}

    def options(self) -> dict[str, Any]:
        """The method's knobs and their values."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def label(self) -> str:
        """Name plus the knobs that differ from their defaults, e.g. ``streaming-local=256``: used for run folders
        (a ``/`` in a value, e.g. a file path, is written ``%2F`` so the label stays one folder)."""
        changed = [
            f"{f.name}={str(getattr(self, f.name)).replace('%', '%25').replace('/', '%2F')}"
            for f in dataclasses.fields(self)
            if f.default is not dataclasses.MISSING and getattr(self, f.name) != f.default
        ]
        return "-".join([self.name, *changed])


REGISTRY: Registry[type[Method]] = Registry("method")


def register(name: str, *aliases: str):
    """Class decorator: register a `Method` dataclass under ``name``."""

    def decorator(cls: type[Method]) -> type[Method]:
        cls.name = name
        REGISTRY.add(name, cls, *aliases)
        return cls

    return decorator


def get(name: str, **kwargs: Any) -> Method:
    """Build the method registered as ``name`` with the given knobs (``methods.get("streaming", local=256)``)."""
    cls = REGISTRY.get(name)
    valid = [f.name for f in dataclasses.fields(cls)]
    for key in kwargs:
        if key not in valid:
            err = did_you_mean(f"option of method {name!r}", key, valid)
            raise UnknownNameError(str(err) if valid else f"method {name!r} takes no options (got {key!r})")
    return cls(**kwargs)


def names() -> list[str]:
    """Registered method names."""
    return REGISTRY.names()
