"""Elastic Attention: a trained router per layer sends each KV head to full or sparse attention at prefill.

Paper: "Elastic Attention: Test-time Adaptive Sparsity Ratios for Efficient Transformers",
https://arxiv.org/abs/2601.17367. The router, relaxation, objective and trainer live in `elastic_bench.method`; this
module adapts them to the `Method` interface.

Design decisions:
- Routers are held by the method (one `AttentionRouter` per layer, keyed by ``layer_idx``), not attached to the
  model, so the backbone's parameters and state dict are untouched and data-parallel training can shard the backbone
  while the routers stay replicated.
- Where the routers come from, in order: routers already set on the method (the trainer's), the ``router=`` path (an
  elastic-bench checkpoint or a released model directory), a checkpoint shipped next to the model in
  ``<model dir>/elastic_router/``; with none of them, `setup` refuses. Fresh untrained routers (seeded) are built only
  when asked for by name, ``router="untrained"``.
- Knob ranges and the router directory's existence are checked when the method is built, before any model loads.
- Prefill (one shot): each sample is routed on its own pre-RoPE keys (the glue plans padded and packed batches one
  sample at a time), with the deterministic argmax. A later prefill chunk reuses the decision its sample got at the
  first chunk (the router never sees the whole prompt in chunked prefill; this is elastic-bench's variant, the paper
  defines one-shot prefill only). Decode steps attend the whole cache (all FULL), as upstream.
- Training: the trainer passes a `TrainingRoute` with each forward (keyword ``training_route``, which reaches the
  method as `AttentionCall.training_route`); the decision is the straight-through Gumbel sample ``r``, recorded into
  the route per (sample, layer), and the attention output mixes both branches per KV head,
  ``out = r·full_side + (1 − r)·sparse_side`` (``attend``). Nothing of a training forward is kept on the method, and
  a layer recomputed in backward (gradient checkpointing) gets the same route, so the same noise and decisions.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from elastic_bench.kernels import HeadPlan, Mode, hybrid_attention
from elastic_bench.modeling.interface import AttentionCall, Method, SparsityKnob, register_method
from elastic_bench.modeling.tensor_parallel import kv_heads, tensor_parallel

from .modes import OFFICIAL_XA_THRESHOLD, PAPER_XA_THRESHOLD, SELECTORS, ModeConfig, Selector

SHIPPED_ROUTER_DIR = "elastic_router"
UNTRAINED = "untrained"  # the `router` value that asks for fresh, seeded, untrained routers
XA_THRESHOLDS = {"paper": PAPER_XA_THRESHOLD, "official": OFFICIAL_XA_THRESHOLD}  # XAttention τ by name


class TrainingRoute:
    """The training state of one forward of N packed samples; the trainer builds one per forward and passes it as the
    forward's ``training_route`` keyword.

    A plain class, not a dataclass: FSDP2 maps over dataclass inputs of a sharded module's forward and hands it a
    copy (``torch.distributed.utils._apply_to_tensors``), whereas the decisions must land in this object, and a layer
    recomputed in backward must see it again.

    Attributes:
        tau: Gumbel temperature.
        noise: ``[N, L, H, 2]`` Gumbel noise of the forward's samples over its L routed layers, in layer order (the
            same tensor when a layer is recomputed in backward, so the recomputation takes the same decisions).
        prompt_lens: ``[N]`` prompt length of each sample: the router pools the prompt tokens only, as at inference.
        pooling: pooling used in training (None: the router's own; ``"mean"`` reproduces the official training).
        decisions: filled by the method: ``(sample, layer) -> r [H]``, the straight-through decision of each KV head
            (1 = full side; hard in the forward pass, the relaxed sample's gradient in backward).
    """

    def __init__(self, tau: float, noise: torch.Tensor, prompt_lens: list[int], pooling: str | None = None):
        self.tau, self.noise, self.prompt_lens, self.pooling = tau, noise, prompt_lens, pooling
        self.decisions: dict[tuple[int, int], torch.Tensor] = {}

    def __repr__(self) -> str:
        return (f"TrainingRoute(tau={self.tau}, noise={tuple(self.noise.shape)}, prompt_lens={self.prompt_lens}, "
                f"pooling={self.pooling!r}, decisions={len(self.decisions)})")

    def stacked(self, layers: list[int]) -> torch.Tensor:
        """The decisions as ``r [N, L, H]`` over the routed ``layers`` (their ``layer_idx``, in order); raises if a
        (sample, layer) was not routed."""
        try:
            return torch.stack([
                torch.stack([self.decisions[(s, layer)] for layer in layers])
                for s in range(len(self.prompt_lens))
            ])
        except KeyError as err:
            raise RuntimeError(f"elastic: no routing decision recorded for (sample, layer) {err}") from None


@register_method("elastic", "elastic_attention")
@dataclass
class Elastic(Method):
    """Elastic Attention: per-prompt routing of every KV head to the full or the sparse side at prefill.

    Args:
        router: router checkpoint directory (``router.safetensors`` + ``router_config.json``, or a released model
            directory); None: the router shipped with the model (``<model dir>/elastic_router/``), an error when
            there is none; ``untrained``: fresh untrained routers (seeded), on purpose.
        mode: ``fa-ssa``, ``fa-xa`` or ``xa-ssa``; None: the checkpoint's (``fa-ssa`` for fresh routers).
        sink, local, granularity: streaming geometry; None: the checkpoint's (128, 2048, ``block`` by default).
        xa_threshold: XAttention threshold τ in [0, 1], or by name: ``paper`` (0.9) or ``official`` (0.8, what the
            official evaluation code of the released FA-XA / XA-SSA routers uses); None: the checkpoint's (0.9 by
            default).
        selector: what selects the blocks of the BLOCK_SPARSE side (fa-xa, xa-ssa): ``xattention`` or a top-k block
            method at its defaults, ``infllm_v2``, ``moba`` or ``nsa`` (FA-InfLLM: ``mode=fa-xa selector=infllm_v2``;
            xa-ssa takes ``xattention`` or ``moba``, whose blocks are the streaming side's); None: the checkpoint's
            (``xattention`` by default).
        seed: initialisation seed of fresh routers.
        margin: a KV head goes to the full side where its full-side logit exceeds the sparse side's by more than this
            (a one-logit router: where its logit exceeds it); 0 is the argmax, the paper's rule. A larger margin sends
            more heads to the sparse side: the knob `elastic-bench calibrate` sets for a budget.
        sparse_decode: decode steps of heads routed to streaming see only sink + window, so an evicting KV cache keeps
            nothing else for them (an extension; upstream decodes densely). Heads routed FULL or to XAttention decode
            densely.
    """

    router: str | None = None
    mode: Literal["fa-ssa", "fa-xa", "xa-ssa"] | None = None
    sink: int | None = None
    local: int | None = None
    granularity: Literal["token", "block"] | None = None
    xa_threshold: float | Literal["paper", "official"] | None = None
    selector: Selector | None = None
    seed: int = 0
    margin: float = 0.0
    sparse_decode: bool = False

    needs_pre_rope_keys = True
    knobs = (SparsityKnob("margin", "higher"),)

    def __post_init__(self):
        from elastic_bench.method.checkpoint import check_router_dir

        if self.router is not None and self.router != UNTRAINED:
            try:
                check_router_dir(self.router)
            except FileNotFoundError as err:
                raise FileNotFoundError(f"{self.name}.router: {err} (expected a router checkpoint directory, or "
                                        f"{UNTRAINED})") from None
        if self.sink is not None and self.sink < 0:
            raise ValueError(f"{self.name}.sink must be >= 0, got {self.sink}")
        if self.local is not None and self.local < 1:
            raise ValueError(f"{self.name}.local must be >= 1, got {self.local}")
        if isinstance(self.xa_threshold, str):
            if self.xa_threshold not in XA_THRESHOLDS:
                raise ValueError(f"{self.name}.xa_threshold must be a number or one of {', '.join(XA_THRESHOLDS)}, "
                                 f"got {self.xa_threshold!r}")
        elif self.xa_threshold is not None and not 0.0 <= self.xa_threshold <= 1.0:  # NaN fails too
            raise ValueError(f"{self.name}.xa_threshold must lie in [0, 1], got {self.xa_threshold}")
        if self.selector is not None and self.selector not in SELECTORS:
            raise ValueError(f"{self.name}.selector must be one of {', '.join(SELECTORS)}, got {self.selector!r}")
        if self.mode is not None and self.selector is not None:
            ModeConfig(mode=self.mode, selector=self.selector)  # a valid combination, before any model loads
        if self.seed < 0:
            raise ValueError(f"{self.name}.seed must be >= 0, got {self.seed}")
        self.routers = None  # elastic_bench.method.RouterBank, set by setup() or by the trainer
        self._decided: dict[int, dict[int, torch.Tensor]] = {}  # layer -> sample -> [H] bool (full side)
        self._sparse_side = self._routed = 0
        self._shard = None  # the model's tensor-parallel shard, set by setup()
        self._row_layout = None  # (key, RowLayout) of the packed training row being attended (`attend_row`)

    def label(self, base: dict[str, Any] | None = None, tag: str | None = None) -> str:
        """`Method.label`, a router path shortened to its last component."""
        if self.router is None or self.router == UNTRAINED:
            return super().label(base, tag)
        shortened = copy.copy(self)  # not dataclasses.replace: the short name is no directory to check
        shortened.router = Path(self.router).name
        return Method.label(shortened, base, tag)

    def overrides(self) -> dict[str, Any]:
        """The `ModeConfig` fields set on this method (they replace a checkpoint's)."""
        knobs = {"mode": self.mode, "sink": self.sink, "local": self.local, "granularity": self.granularity,
                 "xa_threshold": XA_THRESHOLDS.get(self.xa_threshold, self.xa_threshold), "selector": self.selector}
        return {k: v for k, v in knobs.items() if v is not None}

    def resolved_options(self) -> dict[str, Any]:
        """The mode, streaming geometry and XAttention threshold left unset, as the router checkpoint sets them
        (``{"mode": "fa-ssa", "sink": 128, ...}``); {} before `setup` loads the routers."""
        if self.routers is None:
            return {}
        resolved = dataclasses.asdict(self.routers.config.attention)
        return {k: resolved[k] for k, v in self.options().items() if v is None and k in resolved}

    # ---- setup ---------------------------------------------------------------------------------------------------

    def router_dir(self, model_dir: str) -> Path | None:
        """The router checkpoint this method loads for the model at ``model_dir``: ``router``, else the one shipped in
        ``<model dir>/elastic_router/``; None for ``router=untrained``.

        Raises:
            ValueError: no router was given and the model ships none.
        """
        if self.router == UNTRAINED:
            return None
        if self.router is not None:
            return Path(self.router)
        shipped = Path(model_dir) / SHIPPED_ROUTER_DIR if model_dir else None
        if shipped is not None and (shipped / "router_config.json").exists():
            return shipped
        raise ValueError(f"elastic: no router checkpoint for model {model_dir or '(built-in)'}: pass "
                         f"-O elastic.router=DIR, or router={UNTRAINED} to run untrained routers on purpose")

    def artifacts(self, model_dir: str) -> dict[str, Path]:
        if self.routers is not None:  # set by the trainer
            return {}
        directory = self.router_dir(model_dir)
        return {} if directory is None else {"router": directory}

    def provenance(self, name: str, path: Path) -> dict[str, Any] | None:
        """The router checkpoint's ``training.provenance`` (`elastic_bench.method.checkpoint.read_provenance`)."""
        if name != "router":
            return super().provenance(name, path)
        from elastic_bench.method.checkpoint import read_provenance

        return read_provenance(path)

    def hold(self, name: str, path: Path, folder: Path) -> Path:
        """The router checkpoint as `load_routers` reads it from ``path`` (an elastic-bench folder or a released model's
        folder), written anew into ``folder`` (`save_routers`): a run holds the routers alone, not a released model's
        other weights nor a training folder's log and resume state, and a router is known by its weights and
        configuration wherever they were read from."""
        if name != "router":
            return super().hold(name, path, folder)
        from elastic_bench.method import load_routers, save_routers

        return save_routers(load_routers(path), folder)

    def setup(self, model: nn.Module) -> None:
        from elastic_bench.method import ModeConfig, RouterConfig, load_routers

        layout, layers = model_layout(model), routed_layers(model)
        if self.routers is None:
            model_dir = getattr(model.config, "_name_or_path", "") or ""
            directory = self.router_dir(model_dir)
            if directory is None:
                config = RouterConfig(*layout, layer_ids=layer_ids(layers), base_model=model_dir,
                                      attention=ModeConfig(**self.overrides()))
                self.routers = config.build()
                gen = torch.Generator().manual_seed(self.seed)
                for router in self.routers.layers:
                    router.reset_parameters(gen)
            else:
                self.routers = load_routers(directory, **self.overrides())
        config = self.routers.config
        if (config.num_layers, config.num_kv_heads, config.head_dim) != layout or config.routed_layers != layers:
            shown = RouterConfig(*layout, layer_ids=layer_ids(layers)).layout()
            raise ValueError(
                f"router checkpoint {self.router or config.base_model!r} is for {config.layout()}; the model routes "
                f"{shown}"
            )
        self._place_routers(model)
        self._shard = tensor_parallel(model)
        self._decided.clear()
        self._sparse_side = self._routed = 0

    def _place_routers(self, model: nn.Module) -> None:
        """Each layer's router on its layer's device (layers spread by a device map), and under tensor parallelism with
        the centring means of this rank's KV heads only: the MLPs are shared by the heads, the means are per head."""
        from elastic_bench.modeling.attention import attention_modules, module_device

        for module in attention_modules(model):
            router = self.routers[module.layer_idx].to(module_device(module))
            heads = kv_heads(module)
            if router.feature_mean is not None and len(router.feature_mean) != heads.stop - heads.start:  # not yet cut
                router.feature_mean = router.feature_mean[heads]

    def teardown(self, model: nn.Module) -> None:
        self._decided.clear()
        self._row_layout = None

    # ---- planning ------------------------------------------------------------------------------------------------

    def prefill_plan(self, call: AttentionCall) -> HeadPlan:
        modes = self.routers.config.attention
        if call.phase == "chunk":
            decided = self._decided.get(call.layer_idx, {})
            missing = [s for s in call.sample_ids if s not in decided]
            if missing:
                raise RuntimeError(f"elastic: prefill chunk of samples {missing} without a routed first chunk")
            return modes.plan(torch.stack([decided[s] for s in call.sample_ids]), call.query, call.key)
        if call.training_route is not None:
            return self._training_plan(call, call.training_route)
        router = self.routers[call.layer_idx]
        with torch.no_grad():
            full_side = router.decide(router(call.pre_rope_keys), self.margin)
        layer = self._decided.setdefault(call.layer_idx, {})
        for row, sample in enumerate(call.sample_ids):
            layer[sample] = full_side[row]
        self._sparse_side += int((~full_side).sum())
        self._routed += full_side.numel()
        return modes.plan(full_side, call.query, call.key)

    def decode_plan(self, call: AttentionCall) -> HeadPlan:
        """Dense (upstream), or with ``sparse_decode`` each sample's streaming-routed heads STREAMING."""
        modes = self.routers.config.attention
        if not self.sparse_decode or modes.sides[1] != Mode.STREAMING:
            return super().decode_plan(call)
        decided = self._decided.get(call.layer_idx, {})
        missing = [s for s in call.sample_ids if s not in decided]
        if missing:
            raise RuntimeError(f"elastic: decode step of samples {missing} without a routed prefill")
        full_side = torch.stack([decided[s] for s in call.sample_ids])
        plan = torch.where(full_side, int(Mode.FULL), int(Mode.STREAMING)).to(torch.uint8)
        return HeadPlan(plan, modes.geometry, block_size=modes.block_size)

    def _training_plan(self, call: AttentionCall, route: TrainingRoute) -> HeadPlan:
        from elastic_bench.method.relaxation import relax

        modes = self.routers.config.attention
        if call.batch_size != 1:
            raise ValueError("elastic training expects packed rows (batch 1, cu_seq_lens_q/k)")
        sample = call.sample_ids[0]
        keys = call.pre_rope_keys[:, :, : route.prompt_lens[sample]]
        logits = self.routers[call.layer_idx](keys, pooling=route.pooling)  # [1, H, 2]
        noise = route.noise[sample, self.routers.position[call.layer_idx]].to(logits.device)
        r = relax(logits, noise[None], route.tau)  # [1, H], hard forward, soft gradient
        route.decisions[(sample, call.layer_idx)] = r[0]
        return modes.plan(r.detach() > 0.5, call.query, call.key)

    def attend(self, call: AttentionCall, plan: HeadPlan, scale: float | None, backend: str) -> torch.Tensor:
        """Inference: the plan's attention. Training (``call.training_route`` set): ``r·full + (1 − r)·sparse`` per KV
        head, with ``r`` the route's decision of the call's (sample, layer) expanded to the head's G query heads;
        both branches for every head.

        With a compiled backend (``flex``, which compiles once per sequence length) the training branches run on
        zero-padded tensors of `elastic_bench.training.engine.compile_length`."""
        from elastic_bench.training.engine import compile_length

        route = call.training_route
        if route is None:
            return super().attend(call, plan, scale, backend)
        r = route.decisions[(call.sample_ids[0], call.layer_idx)][None]  # [1, H], set by this call's prefill_plan
        modes = self.routers.config.attention
        q, k, v = call.query, call.key, call.value
        length = k.shape[2]
        padded = compile_length(length, modes.block_size) if backend == "flex" else length
        if padded > length:
            q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, padded - length)) for x in (q, k, v))
        full = hybrid_attention(q, k, v, modes.side_plan(True, q, k), scale=scale, backend=backend, sinks=call.sinks)
        sparse = hybrid_attention(q, k, v, modes.side_plan(False, q, k), scale=scale, backend=backend,
                                  sinks=call.sinks)
        G = q.shape[1] // k.shape[1]
        z = r.repeat_interleave(G, dim=1)[:, :, None, None].to(full.dtype)  # [1, Hq, 1, 1]
        return (sparse + z * (full - sparse))[:, :, : call.query.shape[2]]

    def attend_row(self, call: AttentionCall, bounds: list[int], scale: float | None,
                   backend: str) -> torch.Tensor | None:
        """A packed training row in one call on ``flex`` (FA-SSA, unchunked streaming, no learned sinks): every
        sample's router pools its own prompt keys, its decisions go into the route as `_training_plan` records them,
        and both branches run once over the whole row under masks that keep the samples apart (`RowLayout`, built
        once per row). None elsewhere: the glue then routes and attends sample by sample."""
        from elastic_bench.training.engine import compile_length

        from .packed_rows import RowLayout
        from .relaxation import relax

        modes, route = self.routers.config.attention, call.training_route
        if (backend != "flex" or Mode.BLOCK_SPARSE in modes.sides or call.sinks is not None
                or call.value.shape[-1] != call.key.shape[-1]):
            return None
        q, k, v = call.query, call.key, call.value
        length = k.shape[2]
        padded = compile_length(length, modes.block_size)
        router = self.routers[call.layer_idx]
        with_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        key = (tuple(bounds), tuple(route.prompt_lens), padded, route.pooling, q.device, with_grad)
        if self._row_layout is None or self._row_layout[0] != key:
            layout = RowLayout.of(bounds, list(route.prompt_lens), padded,
                                  lambda n: router.pool_weights(n, route.pooling), modes.geometry, modes.block_size,
                                  q.device, with_grad)
            self._row_layout = (key, layout)
        layout = self._row_layout[1]
        samples = len(bounds) - 1
        logits = router.classify(layout.pooled(call.pre_rope_keys, samples))  # [N, H, 2]
        noise = route.noise[:, self.routers.position[call.layer_idx]].to(logits.device)  # [N, H, 2]
        r = relax(logits, noise, route.tau)  # [N, H], hard forward, soft gradient
        for sample in range(samples):
            route.decisions[(sample, call.layer_idx)] = r[sample]
        if padded > length:
            q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, padded - length)) for x in (q, k, v))
        from elastic_bench.kernels.hybrid.flex import flex_masked_attention

        scale = q.shape[-1] ** -0.5 if scale is None else scale
        full = flex_masked_attention(q, k, v, layout.full_mask, scale)
        sparse = flex_masked_attention(q, k, v, layout.sparse_mask, scale)
        z = layout.per_token(r, q.shape[1] // k.shape[1]).to(full.dtype)  # [1, Hq, T', 1]
        return (sparse + z * (full - sparse))[:, :, :length]

    def extra_stats(self) -> dict[str, Any]:
        """``router_sparse_fraction``: share of (prompt, layer, KV head) decisions routed to the sparse side (router
        index 0) since `setup` (equal to ΩMSR in FA-SSA/FA-XA; the streaming share in XA-SSA), over every KV head: under
        tensor parallelism a collective that every rank of the replica calls."""
        counts = (self._sparse_side, self._routed)
        sparse, routed = self._shard.sum(counts) if self._shard is not None else counts  # every rank's heads
        return {"router_sparse_fraction": sparse / routed} if routed else {}


def model_layout(model: nn.Module) -> tuple[int, int, int]:
    """(routed layers, KV heads, key head_dim) of a transformers causal LM: its full-attention layers
    (`elastic_bench.modeling.attention.attention_modules`)."""
    from elastic_bench.modeling.attention import attention_modules, key_dim

    modules = attention_modules(model)
    return len(modules), int(modules[0].config.num_key_value_heads), key_dim(modules[0])


def routed_layers(model: nn.Module) -> list[int]:
    """The ``layer_idx`` of the layers a router routes (`model_layout`'s), in order."""
    from elastic_bench.modeling.attention import attention_modules

    return [m.layer_idx for m in attention_modules(model)]


def layer_ids(layers: list[int]) -> list[int] | None:
    """`RouterConfig.layer_ids` of routers over ``layers``: None where they are ``0 … L − 1``."""
    return None if layers == list(range(len(layers))) else list(layers)
