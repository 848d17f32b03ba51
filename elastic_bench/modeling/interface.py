"""The method interface and its registry: a sparse-attention method is a small dataclass that turns one attention
call into a HeadPlan (after kvpress' presses).

- A method owns its knobs as dataclass fields; `get_method` builds one and rejects unknown knobs or values of the
  wrong type, naming the closest valid ones.
- ``setup(model)`` attaches learned state (routers, gates) and loads artifacts; ``teardown(model)`` removes it.
- ``plan(call)`` is called by the attention glue (`elastic_bench.modeling.attention`) for every layer of every forward;
  `AttentionCall.phase` says whether it is the one-shot prefill, a later prefill chunk, or a decode step. Decode steps
  attend the whole cache by default (`Method.decode_plan`), as the upstream methods do.
- Learned artifacts are files the method loads, never code.
- A method with a sparsity knob names it (`Method.knobs`, `SparsityKnob`): `elastic-bench calibrate` searches it for a
  requested ΩESR or ΩMSR.
- Methods register with `register_method`; the registry imports the modules that installed packages declare under the
  ``elastic_bench.methods`` entry-point group (the baselines, Elastic Attention, any plugin) on the first lookup.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from elastic_bench.foundation.options import check_value
from elastic_bench.foundation.registry import Registry, UnknownNameError, did_you_mean
from elastic_bench.kernels import HeadPlan, hybrid_attention
from elastic_bench.modeling.choices import METHODS_GROUP

Phase = Literal["prefill", "chunk", "decode"]


@dataclass
class AttentionCall:
    """One attention call of one layer, as the glue hands it to `Method.plan`.

    Attributes:
        module: the model's attention module (``layer_idx``, ``config``, anything a method attached in ``setup``).
        query: ``[B, Hq, Lq, D]`` post-RoPE queries.
        key, value: ``[B, H, Lk, D]`` post-RoPE keys, ``[B, H, Lk, Dv]`` values, cache included, not repeated for GQA
            (``Dv < D`` in multi-head latent attention).
        pre_rope_keys: ``[B, H, Lq, D]`` keys of the current tokens before RoPE (after ``k_norm`` where the model has
            one), or None unless the method sets ``needs_pre_rope_keys``.
        sample_ids: index of each batch row among the samples of the current forward (rows of a padded or packed
            batch are planned one sample at a time).
        training_route: what a training forward passed as its ``training_route`` keyword (transformers hands a
            forward's extra keywords to the attention function), or None at inference. A method that trains reads
            its training state from it and writes its decisions back into it.
        sinks: ``[Hq]`` learned sink logits of the layer (gpt-oss's ``s_aux``), or None; `hybrid_attention` takes
            them.
    """

    module: nn.Module
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    pre_rope_keys: torch.Tensor | None = None
    sample_ids: list[int] | None = None
    training_route: Any = None
    sinks: torch.Tensor | None = None

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


@dataclass(frozen=True)
class SparsityKnob:
    """An option of a method that sets how much it skips, for `elastic-bench calibrate` to search.

    Attributes:
        option: the option's name (a field of the method).
        sparser: ``"higher"`` when a larger value skips more pairs, ``"lower"`` when a smaller one does.
        low, high: the values it may take (infinite: unbounded, searched outward from the option's default).
        integer: whether it takes whole numbers only.
    """

    option: str
    sparser: Literal["higher", "lower"]
    low: float = -math.inf
    high: float = math.inf
    integer: bool = False


@dataclass
class Method:
    """Base class of every method. Subclasses are dataclasses registered with `register_method`; their docstring's
    ``Args:`` section documents each knob (``elastic-bench methods`` prints it).

    ``knobs``: the options that set its sparsity, the main one first (a second one refines where the first moves in
    steps coarser than a budget's tolerance); none for a method without one."""

    name: ClassVar[str] = ""
    needs_pre_rope_keys: ClassVar[bool] = False
    knobs: ClassVar[tuple[SparsityKnob, ...]] = ()

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
        return HeadPlan.full(call.batch_size, call.num_kv_heads)  # host modes: no device synchronisation

    def attend(self, call: AttentionCall, plan: HeadPlan, scale: float | None, backend: str) -> torch.Tensor:
        """Compute the call's attention ``[B, Hq, Lq, Dv]`` under ``plan`` on the concrete ``backend`` the glue
        resolved. Methods that train (e.g. mixing a FULL and a sparse branch per head) override this; inference
        methods keep the default."""
        return hybrid_attention(call.query, call.key, call.value, plan, scale=scale, backend=backend, sinks=call.sinks)

    def attend_row(self, call: AttentionCall, bounds: list[int], scale: float | None,
                   backend: str) -> torch.Tensor | None:
        """A training forward's packed row in one call, or None (the default): the glue then plans and attends each
        sample of the row apart (`prefill_plan`, then `attend`, per sample).

        Args:
            call: the whole row: ``query [1, Hq, T, D]``, ``key``/``value [1, H, T, D]``, ``pre_rope_keys [1, H, T,
                D]`` (if the method needs them), ``sample_ids`` ``0 … N − 1``, the ``training_route``.
            bounds: ``[N + 1]`` sample boundaries within the row (its ``cu_seq_lens``), on the host.
            scale, backend: as for `attend`.

        Returns:
            ``[1, Hq, T, Dv]``, each sample's tokens attending only its own earlier tokens, as the per-sample path
            computes them; None where the method has no such path for this call (backend, mode)."""
        return None

    def extra_stats(self) -> dict[str, Any]:
        """Method-specific statistics merged into `MethodHandle.stats` (e.g. realised sparsity of a gate file)."""
        return {}

    def resolved_options(self) -> dict[str, Any]:
        """The options this method left unset (None: a learned file's own) with the values it runs with, once `setup`
        has loaded that file, e.g. ``{"mode": "fa-ssa", "local": 2048}``; a run records them in each cell's
        ``metrics.json`` (``method_resolved``). {} by default: a method whose unset options defer to no file."""
        return {}

    def artifacts(self, model_dir: str) -> dict[str, Path]:
        """The learned files `setup` will load for the model at ``model_dir`` (its local folder, a hub id, or ``""``
        for a built-in model), by option name: a run identifies its results by their contents. None by default."""
        return {}

    def provenance(self, name: str, path: Path) -> dict[str, Any] | None:
        """What the learned file ``path`` (the artifact ``name`` of `artifacts`) was trained on, as its trainer recorded
        it (`elastic_bench.training.provenance`); None when it records nothing (unknown provenance), the default."""
        return None

    def hold(self, name: str, path: Path, folder: Path) -> Path:
        """Put into the private ``folder`` what `setup` loads from the learned file or folder ``path`` (the artifact
        ``name`` of `artifacts`) and return what the run's copy of the method loads instead, by default a copy of
        ``path``. A run knows its results by the digest of what this returns."""
        from elastic_bench.results.digests import copy_artifact

        return copy_artifact(path, folder)

    def check_model(self, config: Any) -> None:
        """Refuse, before the model's weights load, learned files that cannot fit the model whose transformers config
        is ``config`` (gates of another layout, say): a run calls it on the method that loads its held copies. Nothing
        by default.

        Raises:
            ValueError: naming the file and what does not fit.
        """

    def options(self) -> dict[str, Any]:
        """The method's knobs and their values."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def label(self, base: dict[str, Any] | None = None, tag: str | None = None) -> str:
        """Name, then ``tag``, then the knobs that differ from ``base`` (a value per knob; the knob's default for a
        knob it leaves out, or without ``base``), e.g. ``streaming-local=256``: used for run folders (a ``/`` in a
        value, e.g. a file path, is written ``%2F`` so the label stays one folder; a value longer than
        `LABEL_VALUE_LIMIT` characters is shortened, see `label_value`)."""
        base = base or {}
        changed = [
            f"{f.name}={label_value(getattr(self, f.name))}"
            for f in dataclasses.fields(self)
            if f.default is not dataclasses.MISSING and getattr(self, f.name) != base.get(f.name, f.default)
        ]
        return "-".join([self.name, *([tag] if tag else []), *changed])


LABEL_VALUE_LIMIT = 64
"""The longest knob value a method label (a folder name) holds whole, so that a label stays far below the 255 bytes of a
file name."""


def label_value(value: Any) -> str:
    """``value`` as a method label writes it: ``%`` and ``/`` escaped (``%25``, ``%2F``); when that is longer than
    `LABEL_VALUE_LIMIT` (a deep file path), its last path component (at most 32 characters) and ``~`` and 10 hex
    digits of the whole value's SHA-256, e.g. ``full_attention_heads.tsv~3f2a9c1b0d``: short, and distinct for
    distinct values."""
    text = str(value)
    escaped = text.replace("%", "%25").replace("/", "%2F")
    if len(escaped) <= LABEL_VALUE_LIMIT:
        return escaped
    last = text.rstrip("/").rsplit("/", 1)[-1][:32].replace("%", "%25")
    return f"{last}~{hashlib.sha256(text.encode()).hexdigest()[:10]}"


REGISTRY: Registry[type[Method]] = Registry("method", entry_points=METHODS_GROUP)


def register_method(name: str, *aliases: str):
    """Class decorator: register a `Method` dataclass under ``name`` (and ``aliases``)."""

    def decorator(cls: type[Method]) -> type[Method]:
        cls.name = name
        REGISTRY.add(name, cls, *aliases)
        return cls

    return decorator


def get_method(name: str, **options: Any) -> Method:
    """Build the method registered as ``name`` with the given knobs (``get_method("streaming", local=256)``).

    Raises:
        UnknownNameError: no such method, or no such knob.
        ValueError: a knob's value has the wrong type.
    """
    cls = REGISTRY.get(name)
    valid = [f.name for f in dataclasses.fields(cls)]
    for key in options:
        if key not in valid:
            err = did_you_mean(f"option of method {name!r}", key, valid)
            raise UnknownNameError(str(err) if valid else f"method {name!r} takes no options (got {key!r})")
    return cls(**{key: check_value(cls, key, value, f"{name}.{key}") for key, value in options.items()})


def method_names() -> list[str]:
    """Registered method names."""
    return REGISTRY.names()
