"""The Hugging Face glue: one attention function registered with transformers' AttentionInterface, and `apply`.

Design decisions:
- No modeling file is copied. `apply(method, model)` registers the ``"elastic_bench"`` attention and mask functions
  (idempotently), switches the model to them, and restores the previous implementation on exit. Any model whose
  attention modules call the interface and have ``layer_idx`` and ``k_proj`` works (Llama, Qwen2/3, Mistral).
- The registered mask function passes the 2-D padding mask through (or None); causality and sparsity live in the
  kernel. Left-padded rows and packed sequences (``cu_seq_lens_q/k`` kwargs, batch 1) are planned and computed one
  sample at a time, so each prompt is routed on its own tokens.
- Pre-RoPE keys (the Elastic router's input) are captured by forward hooks on ``k_norm`` (Qwen3) or ``k_proj``, only
  for methods that ask for them.
- The active handle is attached to each attention module for the duration of `apply`; nothing is global.
- Decoding: inside `apply`, a forward that starts with an empty `DynamicCache` (what ``generate`` and the harness
  pass) gets a `PackedCache` instead (``kv_cache="evicting"`` or ``"full"``). Each layer is packed by the method's
  decode plan right after its prefill attention, and every decode step attends the packed rows in one call
  (`elastic_bench.kernels.decode`). ``kv_cache="dynamic"`` keeps transformers' cache and the prefill kernels at decode.
- A prefill's time taken apart (``apply(..., time_parts=True)``): each prefill forward (no cache, or an empty one) gets
  a `PartTimer`; the glue marks its parts per layer (the method's plan, the harness's pair counts, the kernel), the
  XAttention estimation marks its own, and forward hooks on the decoder layers and the modules outside them (added for
  that forward only, so decode steps run without them) mark the rest of the model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, get_args

import torch
from torch import nn
from transformers import DynamicCache

from elastic_bench.kernels import SparsityMeter, pair_counts, resolve_backend, sample_means
from elastic_bench.kernels.decode import decode_attention
from elastic_bench.kernels.timing import PARTS, PartTimer, part
from elastic_bench.modeling.choices import KVCache
from elastic_bench.modeling.interface import AttentionCall, Method
from elastic_bench.modeling.kv_cache import CACHE_KEYWORDS, PackedCache, PackedLayer
from elastic_bench.modeling.tensor_parallel import join_heads, tensor_parallel

ATTN_NAME = "elastic_bench"
_HANDLE = "_elastic_bench_handle"
_KEYS = "_elastic_bench_pre_rope_keys"


def padding_mask(
    batch_size: int, q_length: int, kv_length: int, attention_mask: torch.Tensor | None = None, **kwargs: Any
) -> torch.Tensor | None:
    """Mask function registered with ``AttentionMaskInterface``: the 2-D padding mask ``[B, kv_length]`` (bool), or
    None when no token is padding."""
    if attention_mask is None:
        return None
    mask = attention_mask[:, -kv_length:].bool()
    return None if bool(mask.all()) else mask


def attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention function registered as ``"elastic_bench"``: ``query [B, Hq, Lq, D]``, ``key/value [B, H, Lk, D]``
    → ``([B, Lq, Hq, D], None)``."""
    handle: MethodHandle | None = getattr(module, _HANDLE, None)
    if handle is None:
        raise RuntimeError("the model uses elastic_bench attention outside `elastic_bench.apply(method, model)`")
    if dropout:
        raise ValueError("elastic_bench attention does not implement attention dropout")
    window = kwargs.get("sliding_window")
    if window is not None and window < key.shape[2]:
        raise NotImplementedError("sliding-window layers are not supported by elastic_bench attention")
    out = handle.attend(module, query, key, value, attention_mask, scaling, kwargs)
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> None:
    """Register the ``"elastic_bench"`` attention and mask functions with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, attention_forward)
    AttentionMaskInterface.register(ATTN_NAME, padding_mask)


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The attention modules of ``model`` in layer order (modules with ``layer_idx`` and ``k_proj``)."""
    found = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "k_proj")]
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no attention modules with `layer_idx` and `k_proj`; elastic-bench supports "
            "models whose attention calls transformers' AttentionInterface (Llama, Qwen2/3, Mistral, ...)"
        )
    return sorted(found, key=lambda m: m.layer_idx)


class MethodHandle:
    """What `apply` returns: the active method, its statistics and its per-layer decisions."""

    def __init__(self, method: Method, model: nn.Module, backend: str, kv_cache: KVCache = "evicting",
                 time_parts: bool = False):
        if kv_cache not in get_args(KVCache):
            raise ValueError(f"kv_cache must be one of {', '.join(get_args(KVCache))}, got {kv_cache!r}")
        self.method, self.model, self.backend, self.kv_cache = method, model, backend, kv_cache
        self.meter = SparsityMeter()
        self.prefill_backends: Counter[str] = Counter()
        self.cache: PackedCache | None = None  # the packed cache of the running forward
        self.last_cache: PackedCache | None = None  # that of the last generation, until the next forward or reset
        self.time_parts = time_parts
        self.parts: list[PartTimer] = []  # the part timers of the prefill forwards since the last reset
        self._timing = ExitStack()  # the running prefill's part timer and model hooks, closed by `end_forward`

    def reset(self) -> None:
        """Forget the samples recorded so far (call between prompts)."""
        self.meter.reset()
        self.prefill_backends.clear()
        self.last_cache = None
        self.parts.clear()

    def begin_forward(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """Forward pre-hook: a new meter forward, and a `PackedCache` in place of an empty `DynamicCache`; an empty
        `PackedCache` given (a static one, for decode graphs) evicts as ``kv_cache`` says."""
        self.meter.new_forward()
        self.last_cache = None  # released before this forward allocates
        name = next((n for n in CACHE_KEYWORDS if kwargs.get(n) is not None), None)
        past = kwargs[name] if name else None
        empty = past is not None and past.get_seq_length() == 0
        if self.kv_cache != "dynamic" and type(past) is DynamicCache and empty and kwargs.get("cu_seq_lens_q") is None:
            past = kwargs[name] = PackedCache(evict=self.kv_cache == "evicting")
        elif isinstance(past, PackedCache) and empty:
            if self.kv_cache == "dynamic":
                raise ValueError("a packed KV cache was given to a forward under kv_cache='dynamic'")
            past.evict = self.kv_cache == "evicting"
        self.cache = past if isinstance(past, PackedCache) else None
        if self.time_parts and (past is None or empty):
            self._time_parts()
        return args, kwargs

    def _time_parts(self) -> None:
        """A `PartTimer` for this prefill forward, active until `end_forward`, with the model's own modules
        (`model_parts`) marking the part ``model``."""
        self.stop_parts()  # a forward that raised left its timer open
        timer = self._timing.enter_context(PartTimer(next(self.model.parameters()).device).active())
        for module in model_parts(self.model):
            self._timing.enter_context(module.register_forward_pre_hook(lambda *_: timer.enter("model")))
            self._timing.enter_context(module.register_forward_hook(lambda *_: timer.exit()))
        self.parts.append(timer)

    def end_forward(self) -> None:
        """Forward hook: the packed cache stays readable by `stats` until the next forward (decode steps replayed as a
        CUDA graph run no hook, but count their tokens in the cache); a prefill's part timer stops."""
        self.last_cache, self.cache = self.cache, None
        self.stop_parts()

    def stop_parts(self) -> None:
        """Stop the running prefill's part timer and remove its model hooks (nothing when none runs)."""
        self._timing.close()

    def prefill_parts(self) -> list[dict[str, float]]:
        """Seconds per part (`elastic_bench.kernels.timing.PARTS`) of each prefill forward since the last reset, with
        ``time_parts`` ([] without); on CUDA it waits for the device to reach the forwards' last marks."""
        return [{name: seconds.get(name, 0.0) for name in PARTS} for seconds in (t.totals() for t in self.parts)]

    def stats(self) -> dict[str, Any]:
        """``omega_msr``, ``omega_esr``, ``omega_esr_last_row`` (means over samples), ``per_sample`` values,
        ``prefill_backends`` (the kernel backend that ran each prefill call since the last reset: name → calls), and
        the method's own statistics."""
        per_sample = self._meter().per_sample()
        means = sample_means(per_sample)
        held, shard = self.last_cache, tensor_parallel(self.model)
        cache = {}
        if held is not None:
            nbytes = (held.nbytes(), held.full_nbytes())
            cache = dict(zip(("kv_bytes", "kv_bytes_full"), shard.sum(nbytes) if shard else nbytes))
        return {**means, "num_samples": len(per_sample), "per_sample": per_sample,
                "prefill_backends": dict(self.prefill_backends), **cache, **self.method.extra_stats()}

    def decisions(self) -> torch.Tensor:
        """Prefill modes ``[N, L, H]`` (`Mode` values) of the N samples recorded since the last reset."""
        return self._meter().decisions()

    def _meter(self) -> SparsityMeter:
        """The sparsity tallies of every head: this process's, or under tensor parallelism those of the replica's ranks
        joined (`join_heads`, a collective: every rank calls `stats` and `decisions` alike)."""
        shard = tensor_parallel(self.model)
        return self.meter if shard is None else SparsityMeter(join_heads(shard, self.meter.samples))

    def attend(
        self,
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        scaling: float | None,
        kwargs: dict[str, Any],
    ) -> torch.Tensor:
        """Plan and compute one layer's attention; returns ``[B, Hq, Lq, D]``."""
        layer = self.cache.layers[module.layer_idx] if self.cache is not None else None
        if layer is not None and layer.packed is not None:
            return decode_attention(query, layer.packed, scaling, self.backend)
        out = self._attend(module, query, key, value, mask, scaling, kwargs)
        if layer is not None and (query.shape[2] == key.shape[2] or query.shape[2] == 1):  # a prefill, or a decode
            self._pack(layer, module, query, key, value, mask, self.cache.evict)  # step after caller-fed chunks
        return out

    def _pack(self, layer: PackedLayer, module: nn.Module, query, key, value, mask, evict: bool) -> None:
        B = query.shape[0]
        call = AttentionCall(module, query[:, :, -1:], key, value, None, list(range(B)))
        starts = [0] * B if mask is None else (mask.shape[1] - mask.sum(1)).tolist()  # left padding (checked)
        layer.pack(self.method.decode_plan(call), starts, evict=evict)

    def pack_cache(self, cache, evict: bool) -> PackedCache:
        """A `PackedCache` of the unpadded prompt in transformers' ``cache`` (after a prefill under this handle), packed
        by the method's decode plans as the glue packs each layer after its prefill; ``cache`` is left as it was."""
        packed = PackedCache(evict=evict)
        for module in attention_modules(self.model):
            dense = cache.layers[module.layer_idx]
            layer = PackedLayer()
            layer.update(dense.keys, dense.values)
            B, H, _, D = dense.keys.shape
            group = module.config.num_attention_heads // module.config.num_key_value_heads  # query heads per KV head
            query = dense.keys.new_empty((B, H * group, 1, D))
            self._pack(layer, module, query, dense.keys, dense.values, None, evict)
            packed.layers.append(layer)
        return packed

    def _attend(self, module, query, key, value, mask, scaling, kwargs) -> torch.Tensor:
        keys = getattr(module, _KEYS, None) if self.method.needs_pre_rope_keys else None
        route = kwargs.get("training_route")
        pieces = _pieces(query, key, mask, kwargs)
        if pieces is None:
            call = AttentionCall(module, query, key, value, keys, list(range(query.shape[0])), route)
            return self._compute(call, scaling)
        out = torch.zeros_like(query)
        for sample, row, q_sl, k_sl in pieces:
            if q_sl.start >= q_sl.stop:  # a fully padded row
                continue
            sub_keys = keys[row : row + 1, :, q_sl] if keys is not None else None
            call = AttentionCall(
                module, query[row : row + 1, :, q_sl], key[row : row + 1, :, k_sl], value[row : row + 1, :, k_sl],
                sub_keys, [sample], route,
            )
            out[row : row + 1, :, q_sl] = self._compute(call, scaling)
        return out

    def _compute(self, call: AttentionCall, scaling: float | None) -> torch.Tensor:
        with part("routing"):
            plan = self.method.plan(call)
        backend = resolve_backend(self.backend, call.query.device, call.key.shape[2])  # what `auto` runs for this call
        if call.phase != "decode":
            with part("accounting"):
                counts = pair_counts(plan, call.query.shape[2], call.key.shape[2], call.query.shape[1])
                self.meter.record(call.layer_idx, call.phase, call.sample_ids, plan, counts)
            self.prefill_backends[backend] += 1
        with part("attention"):
            return self.method.attend(call, plan, scaling, backend)


def _pieces(query, key, mask, kwargs) -> list[tuple[int, int, slice, slice]] | None:
    """Split a padded or packed batch into (sample, row, query slice, key slice) pieces; None for a plain batch."""
    B, _, Lq, _ = query.shape
    Lk = key.shape[2]
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None:
        if B != 1 or Lq != Lk or not torch.equal(cu_q, cu_k):
            raise ValueError("packed sequences (cu_seq_lens_q/k) are supported for a one-shot prefill of batch 1")
        bounds = cu_q.tolist()
        return [(i, 0, slice(s, e), slice(s, e)) for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:]))]
    if mask is None:
        return None
    if mask.dim() != 2:
        raise ValueError(f"elastic_bench attention takes a 2-D padding mask, got shape {tuple(mask.shape)}")
    pieces = []
    for row in range(B):
        valid = mask[row]
        start = int(valid.int().argmax()) if bool(valid.any()) else Lk
        if not bool(valid[start:].all()):
            raise ValueError("elastic_bench attention needs left padding (padding_side='left')")
        pieces.append((row, row, slice(max(0, start - (Lk - Lq)), Lq), slice(start, Lk)))
    return pieces


def model_parts(model: nn.Module) -> list[nn.Module]:
    """The modules whose forwards make the part ``model`` of a prefill: every decoder layer (the module holding an
    attention module; the attention's own parts are nested in it) and every leaf module outside them (embeddings,
    final norm, rotary embedding, LM head)."""
    modules = dict(model.named_modules())
    attention = {id(m) for m in attention_modules(model)}
    layers = [name.rpartition(".")[0] for name, m in modules.items() if id(m) in attention]
    outside = [m for name, m in modules.items() if next(m.children(), None) is None
               and not any(name == layer or name.startswith(layer + ".") for layer in layers)]
    return [modules[layer] for layer in layers] + outside


def _capture_keys(module: nn.Module, head_dim: int):
    def hook(_, __, output: torch.Tensor) -> None:
        B, L = output.shape[:2]
        keys = output.detach().view(B, L, -1, head_dim).transpose(1, 2)  # this rank's KV heads under tensor parallelism
        setattr(module, _KEYS, keys)

    return hook


@contextmanager
def apply(
    method: Method, model: nn.Module, backend: str = "auto", kv_cache: KVCache = "evicting", time_parts: bool = False
) -> Iterator[MethodHandle]:
    """Run ``model`` with ``method`` inside the block; restores the previous attention implementation on exit.

    Args:
        method: a method from `elastic_bench.get_method`.
        model: a loaded transformers causal LM.
        backend: kernel backend for `hybrid_attention` (``"auto"``, ``"reference"``, ``"triton"``, ...); decode steps
            over a packed cache take the decode kernel it maps to (`elastic_bench.kernels.decode`).
        kv_cache: what a generation decodes with (`elastic_bench.modeling.choices.KVCache`): ``"evicting"`` (a
            `PackedCache` whose STREAMING heads keep sink + window only), ``"full"`` (a `PackedCache` keeping every
            token; streaming heads decode by mask, as upstream) or ``"dynamic"`` (transformers' `DynamicCache`,
            attended by the prefill kernels).
        time_parts: take every prefill forward's time apart (``handle.prefill_parts()``: seconds of the model, the
            method's routing, estimation and planning, the pair accounting and the attention kernels).

    Yields:
        A `MethodHandle`: ``handle.stats()`` gives ΩMSR/ΩESR, ``handle.decisions()`` the per-layer modes.

    Example::

        with apply(get_method("streaming", local=1024), model) as handle:
            model.generate(**inputs, max_new_tokens=32)
        print(handle.stats()["omega_esr"])
    """
    register_attention()
    modules = attention_modules(model)
    handle = MethodHandle(method, model, backend, kv_cache, time_parts)
    method.setup(model)
    hooks = [model.register_forward_pre_hook(lambda _, args, kwargs: handle.begin_forward(args, kwargs),
                                             with_kwargs=True),
             model.register_forward_hook(lambda *_: handle.end_forward())]
    try:
        for module in modules:
            setattr(module, _HANDLE, handle)
            if method.needs_pre_rope_keys:
                source = module.k_norm if hasattr(module, "k_norm") else module.k_proj
                capture = _capture_keys(module, module.head_dim)
                hooks.append(source.register_forward_hook(capture))
        with attention_implementation(model, ATTN_NAME):
            yield handle
    finally:
        handle.stop_parts()  # a forward that raised may have left its part timer and hooks
        for hook in hooks:
            hook.remove()
        for module in modules:
            for attr in (_HANDLE, _KEYS):
                if hasattr(module, attr):
                    delattr(module, attr)
        method.teardown(model)


@contextmanager
def attention_implementation(model: nn.Module, name: str) -> Iterator[None]:
    """Run ``model`` with the attention implementation ``name`` (``"sdpa"``, ``"eager"``, one registered with
    ``AttentionInterface``) inside the block; the previous one is restored on exit."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
