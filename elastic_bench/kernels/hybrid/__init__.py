"""`hybrid_attention`: one call for all heads of a layer, whatever their modes, and its backend shim.

Backends register themselves with `register_backend(name, fn, available, priority, prefer)`. ``backend="auto"``
takes the available backend of highest priority for the inputs' device whose ``prefer(keys)`` (if it has one) holds
for the call's key length; ``"reference"`` is always available and is the ground truth the others are tested against.
A plan with a chunked streaming geometry reaches a backend chunk by chunk through its dense path (`chunked`), unless
the backend computes such plans itself (``native_chunks``: the reference, which evaluates the rule as a mask).

Values may be narrower than queries and keys (multi-head latent attention: DeepSeek-V3's decompressed heads have
192-dim keys and 128-dim values). The reference and the CPU path compute such calls as they are (``value_dims``);
any other backend gets the values zero-padded to the key width and its output's extra columns dropped, as
transformers' flash-attention path does for MLA. Learned sink logits (gpt-oss's attention sinks, ``sinks``) add one
term per query head to every softmax denominator; they are applied after the backend, from the plan's log-sum-exp
(`sinks`), so every backend computes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..plan import HeadPlan
from ..triton_available import triton_available
from .chunked import chunked_hybrid_attention
from .naive import naive_hybrid_attention
from .sinks import with_sinks

BackendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, HeadPlan, float], torch.Tensor]


@dataclass(frozen=True)
class Backend:
    name: str
    fn: BackendFn
    available: Callable[[torch.device], bool]
    priority: int
    prefer: Callable[[int], bool] | None = None
    native_chunks: bool = False
    value_dims: bool = False


_BACKENDS: dict[str, Backend] = {}


def register_backend(
    name: str,
    fn: BackendFn,
    available: Callable[[torch.device], bool],
    priority: int,
    prefer: Callable[[int], bool] | None = None,
    native_chunks: bool = False,
    value_dims: bool = False,
) -> None:
    """Register a backend; ``available(device)`` says whether it can run on that device, ``prefer(keys)``, when
    given, whether ``auto`` should take it for a call with that many keys (otherwise ``auto`` looks further down),
    ``native_chunks`` whether ``fn`` computes chunked streaming geometries itself (otherwise `hybrid_attention` runs
    such plans chunk by chunk through ``fn``'s dense path) and ``value_dims`` whether ``fn`` takes values narrower than
    the keys (otherwise `hybrid_attention` pads them)."""
    _BACKENDS[name] = Backend(name, fn, available, priority, prefer, native_chunks, value_dims)


def backend_names() -> list[str]:
    """All registered backend names, most preferred first."""
    return [b.name for b in sorted(_BACKENDS.values(), key=lambda b: -b.priority)]


def available_backends(device: torch.device | str) -> list[str]:
    """Backends that can run on ``device``, most preferred first."""
    device = torch.device(device)
    return [name for name in backend_names() if _BACKENDS[name].available(device)]


def resolve_backend(backend: str, device: torch.device | str, keys: int | None = None) -> str:
    """The concrete backend ``backend`` means on ``device`` for a call with ``keys`` keys (``"auto"`` → the preferred
    available one; without ``keys``, the one preferred at long lengths)."""
    if backend == "auto":
        names = available_backends(device)
        prefers = (lambda b: keys is None or b.prefer is None or b.prefer(keys))
        return next((n for n in names if prefers(_BACKENDS[n])), names[-1])
    if backend not in _BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose from: auto, {', '.join(backend_names())}")
    if not _BACKENDS[backend].available(torch.device(device)):
        raise RuntimeError(
            f"backend {backend!r} is not available on {device}; available: {', '.join(available_backends(device))}"
        )
    return backend


def hybrid_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: HeadPlan,
    scale: float | None = None,
    backend: str = "auto",
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention where every KV head follows its mode in ``plan`` (FULL, STREAMING or BLOCK_SPARSE).

    Args:
        q: ``[B, Hq, Lq, D]`` queries, post-RoPE.
        k: ``[B, H, Lk, D]`` keys, post-RoPE, not repeated for GQA (``Hq % H == 0``; query head ``i`` uses KV head
            ``i // (Hq // H)``).
        v: ``[B, H, Lk, Dv]`` values (``Dv <= D``; ``Dv < D`` in multi-head latent attention).
        plan: per-sample, per-KV-head modes ``[B, H]``; block selections ``[B, Hq, ceil(Lk/block_size)]``.
        scale: softmax scale, ``D ** -0.5`` by default.
        backend: ``"auto"``, ``"reference"`` or any registered backend (see `available_backends`).
        sinks: ``[Hq]`` learned sink logits (gpt-oss): each query's softmax denominator gains ``exp(sinks[h])``, a
            key-less term, so its output is scaled by ``sigmoid(lse - sinks[h])`` (``lse``: the log-sum-exp of its
            scaled scores over the keys the plan computes); None: no sinks.

    Returns:
        ``[B, Hq, Lq, Dv]`` attention output in ``q.dtype``.

    Causal masks are aligned bottom-right when ``Lq < Lk`` (query ``i`` sits at position ``Lk - Lq + i``)::

        Lq = 2, Lk = 5 (FULL):   1 1 1 1 0
                                 1 1 1 1 1

    A chunked streaming geometry (``plan.streaming.chunk_starts``) runs on every backend: one dense call per chunk
    over the keys its streaming heads see (`chunked.chunked_hybrid_attention`), or the backend's own implementation.
    """
    _check(q, k, v, plan)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    chosen = _BACKENDS[resolve_backend(backend, q.device, k.shape[2])]
    width = v.shape[-1]
    if width != k.shape[-1] and not chosen.value_dims:  # zero columns: the same weights, the output cut back
        v = torch.nn.functional.pad(v, (0, k.shape[-1] - width))
    if plan.streaming.chunk_starts and not chosen.native_chunks:
        out = chunked_hybrid_attention(q, k, v, plan, scale, chosen.fn)
    else:
        out = chosen.fn(q, k, v, plan, scale)
    out = out[..., :width]
    if sinks is not None:
        out = with_sinks(out, q, k, plan, scale, sinks)
    return out


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: HeadPlan) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or v.shape[:3] != k.shape[:3] or v.shape[-1] > k.shape[-1]:
        raise ValueError(
            f"expected q [B, Hq, Lq, D], k [B, H, Lk, D] and v [B, H, Lk, Dv] with Dv <= D; got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    B, Hq, Lq, D = q.shape
    _, H, Lk, Dk = k.shape
    if k.shape[0] != B or Dk != D or Hq % H:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} do not match (batch, head_dim, Hq % H == 0)")
    if Lq > Lk:
        raise ValueError(f"more queries ({Lq}) than keys ({Lk}): append the keys to the cache first")
    if tuple(plan.modes.shape) != (B, H):
        raise ValueError(f"plan is for {tuple(plan.modes.shape)} (batch, KV heads); inputs have ({B}, {H})")
    if plan.blocks is not None:  # present iff a head is BLOCK_SPARSE (HeadPlan checks); no device sync here
        n_blocks = -(-Lk // plan.block_size)
        if plan.blocks.shape != (B, Hq, n_blocks):
            raise ValueError(
                f"block selection covers {plan.blocks.shape} (batch, query heads, query blocks); "
                f"expected {(B, Hq, n_blocks)}"
            )


register_backend("reference", naive_hybrid_attention, available=lambda device: True, priority=0, native_chunks=True,
                 value_dims=True)

from . import external, flex, fused, masked  # noqa: E402  (they import the plan, `masks` and `chunked` only)

# The CPU path, what `auto` takes there: for any plan at most the work of dense attention (see `masked`).
register_backend("masked", masked.masked_hybrid_attention, available=lambda device: device.type == "cpu", priority=1,
                 value_dims=True)

# GPU backends, fastest first (priorities from the H200 measurements in docs/benchmarks.md, "Kernels").
register_backend("split", fused.split_hybrid_attention, available=triton_available, priority=30,
                 prefer=fused.split_pays_off)
register_backend("triton", fused.triton_hybrid_attention, available=triton_available, priority=20)
register_backend("flex", flex.flex_hybrid_attention, available=flex.available, priority=10)
register_backend("block_sparse_attn", external.block_sparse_attn, available=external.block_sparse_attn_available,
                 priority=5)
register_backend("flash_attn", external.flash_attn, available=external.flash_attn_available, priority=4)
