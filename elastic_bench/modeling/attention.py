"""The Hugging Face glue: one attention function registered with transformers' AttentionInterface, and `apply`.

Design decisions:
- No modeling file is copied. `apply(method, model)` registers the ``"elastic_bench"`` attention and mask functions
  (idempotently), switches the model to them, and restores the previous implementation on exit. Any model whose
  attention modules call the interface and have ``layer_idx`` and ``k_proj`` (or MLA's ``kv_b_proj``) works (Llama,
  Qwen2/3, Mistral, Qwen3-MoE, Gemma 3, gpt-oss, Qwen3-Next / Qwen3.5, DeepSeek-V3: docs/architectures.md).
- Layer kinds come from the config (`elastic_bench.modeling.layer_kinds`). The method plans the full softmax layers
  (MLA's included), `attention_modules`; a sliding-window layer is planned here, as STREAMING heads of its window
  with no sink, and recorded as the model's own pattern; linear-attention layers never call the interface. Learned
  sink logits (gpt-oss's ``s_aux``) reach the kernel as `AttentionCall.sinks`.
- The registered mask function passes the 2-D padding mask through (or None); causality and sparsity live in the
  kernel. Left-padded rows and packed sequences (``cu_seq_lens_q/k`` kwargs, batch 1) are planned and computed one
  sample at a time, so each prompt is routed on its own tokens.
- Pre-RoPE keys (the Elastic router's input) are captured by forward hooks on ``k_proj`` (then its ``k_norm`` where
  the model has one: Qwen3, Gemma 3), or for MLA on ``kv_b_proj`` and ``kv_a_proj_with_mqa`` (each head's
  decompressed key before its rotary part turns), only for methods that ask for them.
- The active handle is attached to each attention module for the duration of `apply`; nothing is global.
- Decoding: inside `apply`, a forward that starts with an empty `DynamicCache` (what ``generate`` and the harness
  pass) gets a `PackedCache` instead (``kv_cache="evicting"`` or ``"full"``). Each layer is packed by the method's
  decode plan right after its prefill attention, and every decode step attends the packed rows in one call
  (`elastic_bench.kernels.decode`). ``kv_cache="dynamic"`` keeps transformers' cache and the prefill kernels at decode.
  A sliding-window layer is packed by its window (a ring of ``window`` slots when evicting). Two kinds of layer stay
  dense and decode through the prefill kernels: an MLA layer (its cache holds transformers' compressed latent, the
  smaller of the two) and a layer with learned sinks (the decode kernel has none); a linear-attention layer keeps
  transformers' own recurrent state.
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

from elastic_bench.kernels import (
    STATISTICS,
    HeadPlan,
    Mode,
    SparsityMeter,
    StreamingGeometry,
    hybrid_attention,
    pair_counts,
    resolve_backend,
    sample_means,
)
from elastic_bench.kernels.decode import decode_attention
from elastic_bench.kernels.timing import PARTS, PartTimer, part
from elastic_bench.modeling.choices import KVCache
from elastic_bench.modeling.cost import CostModel, pair_flops
from elastic_bench.modeling.interface import AttentionCall, Method
from elastic_bench.modeling.kv_cache import CACHE_KEYWORDS, PackedCache, PackedLayer
from elastic_bench.modeling.layer_kinds import LayerKind, layer_kinds
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
    if kwargs.get("softcap") is not None:
        raise NotImplementedError("elastic_bench attention does not implement attention-logit soft-capping (Gemma 2)")
    kind = handle.kinds[module.layer_idx]
    window = kwargs.get("sliding_window")
    if window is not None and window != kind.window:
        raise ValueError(f"layer {module.layer_idx} attends a sliding window of {window} tokens, but its config makes "
                         f"it a {kind.kind} layer{f' of window {kind.window}' if kind.window else ''}")
    out = handle.attend(module, query, key, value, attention_mask, scaling, kwargs)
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> None:
    """Register the ``"elastic_bench"`` attention and mask functions with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, attention_forward)
    AttentionMaskInterface.register(ATTN_NAME, padding_mask)


def softmax_modules(model: nn.Module) -> list[nn.Module]:
    """The softmax attention modules of ``model`` in layer order: modules with ``layer_idx`` and ``k_proj`` (or MLA's
    ``kv_b_proj``) whose layer calls the attention interface (full, MLA and sliding-window layers; `layer_kinds`)."""
    kinds = layer_kinds(model.config)
    found = [m for m in model.modules() if hasattr(m, "layer_idx") and (hasattr(m, "k_proj") or hasattr(m, "kv_b_proj"))
             and kinds[m.layer_idx].softmax]
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no attention modules with `layer_idx` and `k_proj`; elastic-bench supports "
            "models whose attention calls transformers' AttentionInterface (Llama, Qwen2/3, Mistral, ...)"
        )
    return sorted(found, key=lambda m: m.layer_idx)


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The attention modules a method plans, in layer order: those of the full softmax layers, MLA's included
    (`LayerKind.routable`); not the sliding-window layers (the model's own sparsity) nor the linear ones (no
    attention). Gate files, router checkpoints and decisions have one row per module of this list.

    Raises:
        ValueError: the model has no such layer.
    """
    kinds = layer_kinds(model.config)
    found = [m for m in softmax_modules(model) if kinds[m.layer_idx].routable]
    if not found:
        raise ValueError(f"{type(model).__name__} has no full-attention layer for a method to plan (layer kinds: "
                         f"{', '.join(sorted({k.kind for k in kinds}))})")
    return found


def key_dim(module: nn.Module) -> int:
    """The width of one key head of attention ``module`` (MLA's ``qk_head_dim``: no-RoPE and RoPE parts together)."""
    return int(getattr(module, "qk_head_dim", None) or module.head_dim)


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s weights."""
    return next(module.parameters()).device


class MethodHandle:
    """What `apply` returns: the active method, its statistics and its per-layer decisions."""

    def __init__(self, method: Method, model: nn.Module, backend: str, kv_cache: KVCache = "evicting",
                 time_parts: bool = False):
        if kv_cache not in get_args(KVCache):
            raise ValueError(f"kv_cache must be one of {', '.join(get_args(KVCache))}, got {kv_cache!r}")
        self.method, self.model, self.backend, self.kv_cache = method, model, backend, kv_cache
        self.kinds: tuple[LayerKind, ...] = layer_kinds(model.config)
        self.cost = CostModel.of(model)
        self.meter = SparsityMeter()
        self.prefill_backends: Counter[str] = Counter()
        self.cache: PackedCache | None = None  # the packed cache of the running forward
        self.last_cache: PackedCache | None = None  # that of the last generation, until the next forward or reset
        self.time_parts = time_parts
        self.parts: list[PartTimer] = []  # the part timers of the prefill forwards since the last reset
        self._timing = ExitStack()  # the running prefill's part timer and model hooks, closed by `end_forward`
        self._host_bounds: tuple[torch.Tensor, list[int]] | None = None  # see `_bounds`

    def _bounds(self, cu_seq_lens: torch.Tensor) -> list[int]:
        """A packed forward's ``cu_seq_lens`` on the host, read once per forward: every layer gets the same tensor
        (and a layer recomputed in backward gets it again), so one device synchronisation serves them all."""
        if self._host_bounds is None or self._host_bounds[0] is not cu_seq_lens:
            self._host_bounds = (cu_seq_lens, cu_seq_lens.tolist())
        return self._host_bounds[1]

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
            past = kwargs[name] = PackedCache(evict=self.kv_cache == "evicting", like=past)
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
        """``omega_msr``, ``omega_esr``, ``omega_esr_last_row``, ``omega_esr_model``, ``attention_share`` and
        ``ceiling`` (means over samples; `elastic_bench.kernels.sparsity`, `elastic_bench.modeling.cost`),
        ``per_sample`` values, ``routed_layers`` (the layers the method planned), ``prefill_backends`` (the kernel
        backend that ran each prefill call since the last reset: name → calls), and the method's own statistics."""
        meter = self._meter()
        per_sample = [self._with_ceiling(sample) for sample in meter.per_sample()]
        means = sample_means(per_sample, MEASURES)
        held, shard = self.last_cache, tensor_parallel(self.model)
        cache = {}
        if held is not None:
            nbytes = (held.nbytes(), held.full_nbytes())
            cache = dict(zip(("kv_bytes", "kv_bytes_full"), shard.sum(nbytes) if shard else nbytes))
        return {**means, "num_samples": len(per_sample), "per_sample": per_sample,
                "routed_layers": meter.routed_layers(), "prefill_backends": dict(self.prefill_backends), **cache,
                **self.method.extra_stats()}

    def _with_ceiling(self, sample: dict[str, float]) -> dict[str, float]:
        """A `SparsityMeter.per_sample` entry with its ``ceiling`` (`CostModel.ceiling`) in place of the FLOPs and
        tokens it was computed from."""
        found = {k: sample[k] for k in STATISTICS}
        found["ceiling"] = self.cost.ceiling(sample["tokens"], sample["attention_flops_full"],
                                             sample["attention_share"])
        return found

    def decisions(self) -> torch.Tensor:
        """Prefill modes ``[N, L, H]`` (`Mode` values) of the N samples recorded since the last reset, over the L
        layers the method planned (`attention_modules`)."""
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
        """Plan and compute one layer's attention; returns ``[B, Hq, Lq, Dv]``."""
        layer = self.cache.layers[module.layer_idx] if self.cache is not None else None
        if layer is not None and layer.packed is not None:
            return decode_attention(query, layer.packed, scaling, self.backend)
        out = self._attend(module, query, key, value, mask, scaling, kwargs)
        if layer is not None and not layer.settled and (query.shape[2] == key.shape[2] or query.shape[2] == 1):
            self._pack(layer, module, query, key, value, mask, self.cache.evict, kwargs.get("s_aux"))  # a prefill,
        return out  # or a decode step after caller-fed chunks

    def _pack(self, layer: PackedLayer, module: nn.Module, query, key, value, mask, evict: bool, sinks) -> None:
        """Pack ``layer`` (holding this forward's dense keys and values) by its decode plan: the window of a sliding
        layer, the method's plan of a routed one; an MLA layer (its latent) and a layer with sinks stay dense."""
        B = query.shape[0]
        starts = [0] * B if mask is None else (mask.shape[1] - mask.sum(1)).tolist()  # left padding (checked)
        kind = self.kinds[module.layer_idx]
        if kind.kind == "mla" or sinks is not None:
            layer.hold_dense(starts)
            return
        call = AttentionCall(module, query[:, :, -1:], key, value, None, list(range(B)))
        plan = window_plan(kind, B, key.shape[1]) if kind.kind == "sliding" else self.method.decode_plan(call)
        layer.pack(plan, starts, evict=evict)

    def pack_cache(self, cache, evict: bool) -> PackedCache:
        """A `PackedCache` of the unpadded prompt in transformers' ``cache`` (after a prefill under this handle), packed
        by the method's decode plans as the glue packs each layer after its prefill; ``cache`` is left as it was."""
        packed = PackedCache(evict=evict)
        for module in softmax_modules(self.model):
            if module.layer_idx != len(packed.layers) or self.kinds[module.layer_idx].kind == "mla":
                raise ValueError("a static packed cache (decode graphs) needs every layer packed: this model has "
                                 "linear-attention or MLA layers")
            dense = cache.layers[module.layer_idx]
            layer = PackedLayer()
            layer.update(dense.keys, dense.values)
            B, H, _, D = dense.keys.shape
            group = module.config.num_attention_heads // module.config.num_key_value_heads  # query heads per KV head
            query = dense.keys.new_empty((B, H * group, 1, D))
            self._pack(layer, module, query, dense.keys, dense.values, None, evict, getattr(module, "sinks", None))
            packed.layers.append(layer)
        return packed

    def _attend(self, module, query, key, value, mask, scaling, kwargs) -> torch.Tensor:
        keys = _pre_rope_keys(module) if self.method.needs_pre_rope_keys else None
        route, sinks = kwargs.get("training_route"), kwargs.get("s_aux")
        cu_seq_lens = kwargs.get("cu_seq_lens_q")
        if route is not None and cu_seq_lens is not None and self.kinds[module.layer_idx].routable:
            bounds = self._bounds(cu_seq_lens)  # a packed training row: one call where the method attends it whole
            whole = AttentionCall(module, query, key, value, keys, list(range(len(bounds) - 1)), route, sinks)
            backend = resolve_backend(self.backend, query.device, key.shape[2])
            out = self.method.attend_row(whole, bounds, scaling, backend)
            if out is not None:
                return out
        pieces = _pieces(query, key, mask, kwargs, self._bounds)
        if pieces is None:
            call = AttentionCall(module, query, key, value, keys, list(range(query.shape[0])), route, sinks)
            return self._compute(call, scaling)
        out = query.new_zeros((*query.shape[:3], value.shape[-1]))
        for sample, row, q_sl, k_sl in pieces:
            if q_sl.start >= q_sl.stop:  # a fully padded row
                continue
            sub_keys = keys[row : row + 1, :, q_sl] if keys is not None else None
            call = AttentionCall(
                module, query[row : row + 1, :, q_sl], key[row : row + 1, :, k_sl], value[row : row + 1, :, k_sl],
                sub_keys, [sample], route, sinks,
            )
            out[row : row + 1, :, q_sl] = self._compute(call, scaling)
        return out

    def _compute(self, call: AttentionCall, scaling: float | None) -> torch.Tensor:
        """The call's attention: the method's plan of a routed layer, the window of a sliding one (the model's own,
        computed here); its pairs recorded at prefill. Each part is marked for a prefill timed apart (`PartTimer`)."""
        kind = self.kinds[call.layer_idx]
        own = not kind.routable
        with part("routing"):
            plan = window_plan(kind, call.batch_size, call.num_kv_heads) if own else self.method.plan(call)
        backend = resolve_backend(self.backend, call.query.device, call.key.shape[2])  # what `auto` runs for this call
        if call.phase != "decode" and call.training_route is None:  # a training forward is not metered
            q, k, v = call.query, call.key, call.value
            with part("accounting"):
                counts = pair_counts(plan, q.shape[2], k.shape[2], q.shape[1])
                self.meter.record(call.layer_idx, call.phase, call.sample_ids, plan, counts, own=own,
                                  pair_flops=pair_flops(q.shape[1], k.shape[1], k.shape[-1], v.shape[-1]))
        if call.phase != "decode":
            self.prefill_backends[backend] += 1
        with part("attention"):
            if own:
                return hybrid_attention(call.query, call.key, call.value, plan, scale=scaling, backend=backend,
                                        sinks=call.sinks)
            return self.method.attend(call, plan, scaling, backend)


MEASURES = (*STATISTICS, "ceiling")  # what `MethodHandle.stats` averages over samples


def window_plan(kind: LayerKind, batch_size: int, num_kv_heads: int) -> HeadPlan:
    """The plan of a sliding-window layer: every head STREAMING over the last ``kind.window`` tokens, no sink (host
    modes)."""
    geometry = StreamingGeometry(sink=0, local=kind.window, granularity="token")
    return HeadPlan.uniform(Mode.STREAMING, batch_size, num_kv_heads, streaming=geometry)


def _pieces(query, key, mask, kwargs, host_bounds) -> list[tuple[int, int, slice, slice]] | None:
    """Split a padded or packed batch into (sample, row, query slice, key slice) pieces; None for a plain batch.
    ``host_bounds``: a packed batch's ``cu_seq_lens`` tensor → the same on the host (`MethodHandle._bounds`)."""
    B, _, Lq, _ = query.shape
    Lk = key.shape[2]
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None:
        if B != 1 or Lq != Lk or not (cu_q is cu_k or torch.equal(cu_q, cu_k)):
            raise ValueError("packed sequences (cu_seq_lens_q/k) are supported for a one-shot prefill of batch 1")
        bounds = host_bounds(cu_q)
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
    attention = {id(m) for m in softmax_modules(model)}
    layers = [name.rpartition(".")[0] for name, m in modules.items() if id(m) in attention]
    outside = [m for name, m in modules.items() if next(m.children(), None) is None
               and not any(name == layer or name.startswith(layer + ".") for layer in layers)]
    return [modules[layer] for layer in layers] + outside


def _capture_keys(module: nn.Module, head_dim: int, name: str = _KEYS, width: slice | None = None):
    """A forward hook that keeps its output ``[B, L, H·head_dim]`` (or ``[B, 1, L, H·head_dim]``: MLA's latent) as
    ``[B, H, L, head_dim]`` keys on ``module`` under ``name``; ``width``: the columns of each head to keep."""

    def hook(_, __, output: torch.Tensor) -> None:
        B, L = output.shape[0], output.shape[-2]
        keys = output.detach().reshape(B, L, -1, head_dim).transpose(1, 2)  # this rank's KV heads under TP
        setattr(module, name, keys if width is None else keys[..., width])

    return hook


_ROPE_KEYS = "_elastic_bench_pre_rope_shared_keys"  # MLA: the RoPE part of the keys, shared by the heads


def _key_hooks(module: nn.Module) -> list[tuple[nn.Module, Any]]:
    """(source module, forward hook) pairs that capture ``module``'s pre-RoPE keys: the output of ``k_proj`` (its
    ``k_norm``, where it has one, applied by `_pre_rope_keys`: a norm over each head's vector, whatever order of axes
    the model calls it in); for MLA each head's no-RoPE key from ``kv_b_proj`` and the shared RoPE part from
    ``kv_a_proj_with_mqa``, before rotation."""
    if hasattr(module, "kv_b_proj"):
        nope, rope = module.qk_nope_head_dim, module.qk_rope_head_dim
        return [(module.kv_b_proj, _capture_keys(module, nope + module.v_head_dim, width=slice(0, nope))),
                (module.kv_a_proj_with_mqa, _capture_keys(module, module.kv_lora_rank + rope, _ROPE_KEYS,
                                                          slice(module.kv_lora_rank, None)))]
    return [(module.k_proj, _capture_keys(module, module.head_dim))]


def _pre_rope_keys(module: nn.Module) -> torch.Tensor | None:
    """``[B, H, L, D]`` pre-RoPE keys of the call's L tokens captured by `_key_hooks`: after ``k_norm`` where the
    module has one; for MLA the no-RoPE part, then the RoPE part shared by the heads."""
    keys = getattr(module, _KEYS, None)
    if keys is None:
        return None
    if hasattr(module, "k_norm"):
        with torch.no_grad():
            return module.k_norm(keys)
    shared = getattr(module, _ROPE_KEYS, None)
    if shared is None:
        return keys
    current = keys[:, :, keys.shape[2] - shared.shape[2]:]  # kv_b_proj decompresses the cached tokens too
    return torch.cat([current, shared.expand(-1, keys.shape[1], -1, -1)], dim=-1)


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
    modules = softmax_modules(model)
    routed = {id(m) for m in attention_modules(model)}
    handle = MethodHandle(method, model, backend, kv_cache, time_parts)
    method.setup(model)
    hooks = [model.register_forward_pre_hook(lambda _, args, kwargs: handle.begin_forward(args, kwargs),
                                             with_kwargs=True),
             model.register_forward_hook(lambda *_: handle.end_forward())]
    try:
        for module in modules:
            setattr(module, _HANDLE, handle)
            if method.needs_pre_rope_keys and id(module) in routed:
                hooks += [source.register_forward_hook(hook) for source, hook in _key_hooks(module)]
        with attention_implementation(model, ATTN_NAME):
            yield handle
    finally:
        handle.stop_parts()  # a forward that raised may have left its part timer and hooks
        for hook in hooks:
            hook.remove()
        for module in modules:
            for attr in (_HANDLE, _KEYS, _ROPE_KEYS):
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
