"""``elastic-bench bench prefill``: the end-to-end prefill time of a model under each method, beside full attention and
the floor no sparse method can beat.

One model, batch 1 (in one process, or under ``torchrun`` over the ranks of one tensor-parallel model): every
measurement is one forward of random token ids (``logits_to_keep=1``, ``use_cache=False``, `torch.inference_mode`),
bf16 on CUDA and fp32 on the CPU.

Design decisions:
- Two references at every length, always run first: ``floor`` (the attention replaced by a no-op that returns zeros,
  registered with transformers' ``AttentionInterface`` under a private name: the whole forward but the attention
  kernel) and ``full`` (the `full` method through `elastic_bench.apply`); ``sdpa`` (the model's own SDPA attention,
  without elastic-bench's glue) when asked for.
- ``× full`` is t_full / t (medians). A method whose attention costs the share ``attention_share`` of the model's own
  attention FLOPs (`elastic_bench.kernels.sparsity`: every softmax layer, a sliding window as it is; 1 − ΩESR on a
  model of full layers alone) would at best take t_floor + (t_full − t_floor)·share: the rest of the forward
  unchanged. ``ideal_speedup`` is t_full over that time, ``fraction_of_ideal`` the measured speedup over the ideal (1
  for full and for the floor). ``ceiling`` is the same bound from FLOPs alone, without a measurement
  (`elastic_bench.modeling.cost`: the model's linear-attention layers and MLP or MoE at its active experts against
  the attention of each layer kind), the figure a run records per cell; the table prints it beside ``× full``.
- ``fa-ssa``, ``fa-xa``, ``xa-ssa``: Elastic Attention's modes without a router (`SeededModes`): round(ΩMSR·L·H)
  (layer, KV head) pairs, drawn with the seed, on the sparse side, the others on the full side, planned by
  `ModeConfig.plan` (which runs the XAttention estimation of the XA heads). ``--density`` replaces the estimated
  selection by random blocks (random weights make XAttention keep nearly every block); the estimation still runs
  and is timed. The random blocks are drawn in the untimed warm-up forward and reused by the timed ones.
- ``infllm_v2``, ``moba``, ``nsa`` (the top-k block methods), ``xattention``, ``streaming``: the registered method
  at its defaults, or with the knobs of ``--method-options`` (e.g. a threshold or a top-k that puts two methods at the
  same ΩESR); their block selection is all their ``plan`` does, so its time is the routing time below.
- ``duo_attention``: the gates of ``--pattern``, or seeded uniform gates written as a temporary
  ``full_attention_heads.tsv``; binarised at ``sparsity = --omega-msr`` either way, so every method with a static
  head split streams the same share of heads.
- Each timed forward through `elastic_bench.apply` is taken apart (``apply(..., time_parts=True)``,
  `elastic_bench.kernels.timing.PARTS`: the model, the method's routing, estimation and planning, the harness's pair
  accounting, the attention kernels; CUDA events, no synchronisation, on the GPU; perf_counter on the CPU): a record
  holds each part's mean over the timed forwards (``parts_s``) and what they leave of the forward's mean
  (``unexplained_s``); its ``routing_seconds`` is the median of routing, estimation and planning together, its
  ``estimation_seconds`` that of the estimation (XAttention's scoring and selection). Under tensor parallelism the
  parts are rank 0's.
- Timing: at each length every method's untimed warm-up forward (it compiles the Triton kernels), then ``--repeats``
  rounds of one timed forward per method in turn, so a drift of the device over the sweep (its clock and temperature
  under the power limit) reaches every method alike rather than the methods timed last. Each forward runs inside its
  method's context (`elastic_bench.apply`, or the floor's or SDPA's implementation), bracketed by CUDA events
  (perf_counter on the CPU), read after one synchronisation at the end; the median and the mean, and the peak
  allocated memory of the timed forwards on CUDA. The statistics of a method's timed forwards are pooled over its
  contexts.
- A method that fails (out of memory at 256K, ...) is recorded with its error and the sweep goes on. Inputs are
  checked before the model loads.
- Tensor parallelism (``--tp N`` under ``torchrun --nproc-per-node N``): the model is loaded as ``run --tp`` loads it
  (`elastic_bench.modeling.loading.load_model`, each rank planning its own KV heads; one replica, so ``N`` is every
  process), every rank takes the same forwards, each timed forward between two barriers of the ranks, and a span's
  time is the slowest rank's. The seeded head splits and random blocks are drawn over every head and sliced to the
  rank's, the sparsity tallies are joined over ranks, so ΩMSR, ΩESR and the block density are one process's. The
  floor and the ideal speedup keep their definitions: the floor is the tensor-parallel forward without attention, so
  the ranks' communication counts as the part of the forward no sparse method shortens. Ranks agree on every failure
  (a method that fails on one rank before its collectives is recorded as failed on all); rank 0 returns the report.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, get_args

import torch

from elastic_bench.bench import formatted, with_provenance, with_router
from elastic_bench.kernels import BlockSelection, HeadPlan, Mode, sample_means
from elastic_bench.kernels.timing import PARTS, DeviceTimer, unexplained
from elastic_bench.method.modes import ModeConfig, ModeName
from elastic_bench.modeling.attention import MEASURES, attention_implementation
from elastic_bench.modeling.interface import AttentionCall, Method
from elastic_bench.modeling.tensor_parallel import TensorParallel, kv_heads, query_heads, tensor_parallel

REFERENCES = ("floor", "full")  # run at every length, first: every ratio needs them
MODES = get_args(ModeName)
REGISTERED = ("duo_attention", "streaming", "xattention", "infllm_v2", "moba", "nsa", "elastic")  # through get_method
METHODS = (*REFERENCES, "sdpa", *MODES, *REGISTERED)
FLOOR_ATTENTION = "_elastic_bench_floor"  # the no-op attention's name in transformers' AttentionInterface
STAT_KEYS = ("omega_msr", "omega_esr", "omega_esr_last_row", "omega_esr_model", "attention_share", "ceiling",
             "num_samples", "per_sample", "routed_layers", "prefill_backends")


@dataclass
class PrefillBenchConfig:
    """What ``bench prefill`` measures.

    Attributes:
        model: model spec: random:llama-3.1-8b, random:qwen3-8b, random:llama-3.1-70b (random weights at the real
            shapes), tiny:llama, a local folder or a hub id.
        lengths: comma-separated prompt lengths in tokens (e.g. 32K,128K,256K).
        methods: comma-separated methods: full, fa-ssa, fa-xa, xa-ssa (Elastic Attention's modes with a seeded head
            split), duo_attention, streaming, xattention, infllm_v2, moba, nsa, elastic (needs --router), sdpa (the
            model's own attention); floor (no attention) and full always run.
        method_options: comma-separated knobs of the registered methods among --methods, METHOD.OPTION=VALUE (values
            read as YAML scalars, as run -O reads them), e.g. xattention.threshold=0.5,infllm_v2.topk=32 (see
            elastic-bench methods).
        omega_msr: share of (layer, KV head) pairs on the sparse side of fa-ssa, fa-xa and xa-ssa, and the sparsity
            duo_attention binarises its gates at.
        density: replace the XAttention selection of the BLOCK_SPARSE heads of fa-xa and xa-ssa by random blocks at
            this density of the causal blocks (block 0, the diagonal and random ones); the estimation still runs and
            is timed (none: XAttention's selection).
        pattern: DuoAttention gate file or folder (full_attention_heads.tsv; none: seeded random gates).
        router: Elastic router checkpoint folder: adds the elastic method, its mode from the checkpoint (untrained:
            seeded untrained routers).
        backend: attention kernel backend passed to apply: auto, reference, triton, split, flex, ...
        repeats: timed forwards per method and length (rounds of one per method), after one untimed warm-up
            forward each.
        seed: seed of the token ids, the head splits, the gates and the random blocks.
        device: cuda, cpu, cuda:1, ... (none: cuda when available; under torchrun each rank's own GPU).
        output: JSON file the results are written to (by rank 0 under torchrun).
        progress: show a progress bar.
        tp: tensor parallelism: under torchrun --nproc-per-node TP, the model sharded over the TP ranks as run --tp
            shards it, every forward timed on every rank between barriers (a span's time: the slowest rank's).
    """

    model: str = "random:llama-3.1-8b"
    lengths: list[int] = field(default_factory=lambda: [32768, 131072, 262144])
    methods: list[str] = field(
        default_factory=lambda: ["full", "fa-ssa", "fa-xa", "xa-ssa", "duo_attention", "streaming", "xattention"])
    method_options: list[str] = field(default_factory=list)
    omega_msr: float = 0.7
    density: float | None = None
    pattern: str | None = None
    router: str | None = None
    backend: str = "auto"
    repeats: int = 3
    seed: int = 0
    device: str | None = None
    output: str = "runs/bench/prefill.json"
    progress: bool = True
    tp: int = 1

    def __post_init__(self):
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown method(s) {', '.join(unknown)}; valid: {', '.join(METHODS)}")
        if not self.methods:
            raise ValueError(f"--methods is empty; valid: {', '.join(METHODS)}")
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError(f"lengths must be positive token counts, got {','.join(map(str, self.lengths)) or 'none'}")
        if not 0.0 <= self.omega_msr <= 1.0:  # NaN fails too
            raise ValueError(f"omega_msr must lie in [0, 1], got {self.omega_msr}")
        if self.density is not None and not 0.0 < self.density <= 1.0:
            raise ValueError(f"density must lie in (0, 1] (or be none), got {self.density}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.tp < 1:
            raise ValueError(f"tp must be at least 1, got {self.tp}")
        if self.pattern is not None and not Path(self.pattern).exists():
            raise FileNotFoundError(f"--pattern: no file or folder at {self.pattern} (expected a "
                                    "full_attention_heads.tsv or a folder holding one)")
        self.methods = with_router(self.methods, self.router)
        self.knobs = method_knobs(self.method_options, [m for m in self.methods if m in REGISTERED])


def method_knobs(items: list[str], methods: list[str]) -> dict[str, dict[str, Any]]:
    """``METHOD.OPTION=VALUE`` items as ``{method: {option: value}}`` (read as ``run -O`` reads them), each ``METHOD``
    one of ``methods``; the options themselves are checked when the methods are built, before the model loads.

    Raises:
        ValueError: an item is not ``METHOD.OPTION=VALUE``, or names a method not among ``methods``.
    """
    from elastic_bench.evaluation.commands import _method_options

    knobs = _method_options(items)
    for method in knobs:
        if method not in methods:
            raise ValueError(f"--method-options: {method!r} is not a registered method of --methods "
                             f"({', '.join(methods) or 'none'})")
    return knobs


# ---- timing ----------------------------------------------------------------------------------------------------


class Stopwatch:
    """Named spans of work in each timed forward, timed by a `DeviceTimer` (CUDA events on a CUDA device, read after
    one synchronisation at the end; perf_counter elsewhere). Spans outside a timed forward (``forward`` None: the
    warm-up) are not kept."""

    def __init__(self, device: torch.device):
        self.timer = DeviceTimer(device)
        self.cuda = self.timer.cuda
        self.forward: int | None = None  # index of the timed forward under way
        self._names: list[tuple[str, int]] = []  # (name, forward) of each span of the timer

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Time the block as one span of ``name`` in the current timed forward."""
        index = self.forward
        if index is None:
            yield
            return
        with self.timer.span():
            yield
        self._names.append((name, index))

    def totals(self, forwards: int) -> dict[str, list[float]]:
        """``{name: [seconds in forward 0, 1, ...]}``: the sum of each name's spans per timed forward."""
        found: dict[str, list[float]] = {}
        for (name, index), seconds in zip(self._names, self.timer.elapsed(), strict=True):
            found.setdefault(name, [0.0] * forwards)[index] += seconds
        return found


class BlockCounter:
    """Wraps ``method.plan`` (an instance attribute that shadows the class's method, removed by `remove`): in the
    warm-up forward the key blocks the BLOCK_SPARSE heads keep are counted (`density`)."""

    def __init__(self, method: Method, stopwatch: Stopwatch):
        self.method, self.stopwatch = method, stopwatch
        self.inner: Callable[[AttentionCall], HeadPlan] = method.plan
        self.selected = self.causal = 0
        method.plan = self

    def __call__(self, call: AttentionCall) -> HeadPlan:
        plan = self.inner(call)
        if self.stopwatch.forward is None and plan.blocks is not None and call.phase == "prefill":
            self._count(plan, call.query.shape[1])
        return plan

    def _count(self, plan: HeadPlan, query_heads: int) -> None:
        heads = (plan.modes == Mode.BLOCK_SPARSE).repeat_interleave(query_heads // plan.num_kv_heads, dim=1)  # [B, Hq]
        n = plan.blocks.shape[2]
        self.selected += int(plan.blocks.counts[heads].sum())
        self.causal += int(heads.sum()) * n * (n + 1) // 2

    def density(self, shard: TensorParallel | None) -> float | None:
        """Selected key blocks over causal blocks of the BLOCK_SPARSE query heads, those of every rank of ``shard``
        (a collective) or of this process (None without any)."""
        counts = (self.selected, self.causal)
        selected, causal = shard.sum(counts) if shard else counts
        return selected / causal if causal else None

    def remove(self) -> None:
        vars(self.method).pop("plan", None)


# ---- methods ---------------------------------------------------------------------------------------------------


@dataclass
class SeededModes(Method):
    """Elastic Attention's modes with a fixed head split instead of a router: round(ΩMSR·L·H) of the (layer, KV head)
    pairs, drawn with ``seed``, on the sparse side, the others on the full side, planned by `ModeConfig.plan`. Not
    registered.

    Args:
        mode: ``fa-ssa``, ``fa-xa`` or ``xa-ssa`` (`elastic_bench.method.modes`).
        omega_msr: share of (layer, KV head) pairs on the sparse side.
        density: replace the XAttention selection of the BLOCK_SPARSE heads by random blocks at this density of the
            causal blocks (block 0, the diagonal and random ones; drawn once per layer and length, at the first call);
            None keeps XAttention's. The estimation runs either way.
        seed: seed of the split and of the random blocks.
    """

    name: ClassVar[str] = "seeded-modes"

    mode: ModeName = "fa-ssa"
    omega_msr: float = 0.7
    density: float | None = None
    seed: int = 0

    def __post_init__(self):
        self.config = ModeConfig(mode=self.mode)  # checks the mode
        if not 0.0 <= self.omega_msr <= 1.0:
            raise ValueError(f"{self.name}.omega_msr must lie in [0, 1], got {self.omega_msr}")
        if self.density is not None and not 0.0 < self.density <= 1.0:
            raise ValueError(f"{self.name}.density must lie in (0, 1], got {self.density}")
        self.full_side: torch.Tensor | None = None  # [L, H] bool, set by setup
        self._full_side: dict[int, torch.Tensor] = {}  # layer_idx -> [H] bool on the model's device
        # (layer_idx, B, Lk) -> random blocks, kept across `apply` contexts (the benchmark enters one per forward)
        self._blocks: dict[tuple[int, int, int], BlockSelection] = {}

    def setup(self, model: torch.nn.Module) -> None:
        from elastic_bench.modeling.attention import attention_modules

        modules = attention_modules(model)
        layers, heads = len(modules), int(modules[0].config.num_key_value_heads)
        order = torch.randperm(layers * heads, generator=torch.Generator().manual_seed(self.seed))
        full_side = torch.ones(layers * heads, dtype=torch.bool)
        full_side[order[: round(self.omega_msr * layers * heads)]] = False
        self.full_side = full_side.view(layers, heads)
        device = next(model.parameters()).device
        for row, module in enumerate(modules):
            mine = self.full_side[row, kv_heads(module)]  # the KV heads this rank holds (all of them without --tp)
            self._full_side[module.layer_idx] = mine.to(device)

    def prefill_plan(self, call: AttentionCall) -> HeadPlan:
        full_side = self._full_side[call.layer_idx].expand(call.batch_size, -1)
        plan = self.config.plan(full_side, call.query, call.key)  # the XAttention estimation marks its own part
        if self.density is not None and plan.blocks is not None:
            plan = dataclasses.replace(plan, blocks=self._random_blocks(call))
        return plan

    def _random_blocks(self, call: AttentionCall) -> BlockSelection:
        """Random blocks ``[B, Hq, nB]`` (CSR) for the call's layer and shape, drawn once (one draw per KV head of the
        model, sliced to the query heads this rank holds: a tensor-parallel rank draws what one process draws)."""
        from elastic_bench.kernels.bench import KernelBenchConfig, random_blocks

        B, length, config = call.batch_size, call.key.shape[2], call.module.config
        key = (call.layer_idx, B, length)
        if key not in self._blocks:
            if self.config.block_size != 128:
                raise ValueError(f"random blocks are 128 tokens; the mode's block size is {self.config.block_size}")
            if any(k[2] != length for k in self._blocks):  # keep the blocks of one length only
                self._blocks.clear()
            shape = KernelBenchConfig(lengths=[length], batch=B, query_heads=config.num_attention_heads,
                                      kv_heads=config.num_key_value_heads, density=self.density)
            device = call.query.device
            gen = torch.Generator(device=device).manual_seed(self.seed * 1_000_003 + call.layer_idx)
            dense = random_blocks(shape, length, device, gen)[:, query_heads(call.module)]  # [B, rank's Hq, nB, nB]
            self._blocks[key] = BlockSelection.from_dense(dense)
        return self._blocks[key]


def seeded_gates(layers: int, heads: int, seed: int, folder: str | Path) -> Path:
    """Write uniform random gates ``[layers, heads]`` (seeded) as ``folder/full_attention_heads.tsv`` (DuoAttention's
    layout: rows = layers, columns = KV heads); returns the file."""
    import numpy as np

    path = Path(folder) / "full_attention_heads.tsv"
    np.savetxt(path, np.random.default_rng(seed).uniform(size=(layers, heads)), delimiter="\t", fmt="%.6f")
    return path


def build_method(name: str, model: torch.nn.Module, cfg: PrefillBenchConfig, scratch: str | Path) -> Method:
    """The method ``name`` of the benchmark (one of `METHODS` except the floor and sdpa) for ``model``."""
    from elastic_bench.modeling.attention import attention_modules
    from elastic_bench.modeling.interface import get_method

    if name in MODES:
        return SeededModes(mode=name, omega_msr=cfg.omega_msr, density=cfg.density, seed=cfg.seed)
    knobs = cfg.knobs.get(name, {})
    if name == "duo_attention":
        pattern = cfg.pattern
        if pattern is None:
            layers, heads = len(attention_modules(model)), int(model.config.num_key_value_heads)
            pattern = str(seeded_gates(layers, heads, cfg.seed, scratch))
        return get_method("duo_attention", **{"pattern": pattern, "sparsity": cfg.omega_msr, **knobs})
    if name == "elastic":
        return get_method("elastic", **{"router": cfg.router, **knobs})
    return get_method(name, **knobs)


def _no_attention(module, query: torch.Tensor, key, value, attention_mask, **kwargs) -> tuple[torch.Tensor, None]:
    """The floor's attention function: ``query [B, Hq, Lq, D]`` → zeros ``[B, Lq, Hq, Dv]`` (no attention at all)."""
    B, Hq, Lq, _ = query.shape
    return query.new_zeros(B, Lq, Hq, value.shape[-1]), None


# ---- the benchmark ---------------------------------------------------------------------------------------------


def check_ranks(cfg: PrefillBenchConfig) -> None:
    """Refuse a tensor-parallel benchmark that cannot work, in one line before any weights load: the benchmark times
    one model, so ``torchrun``'s processes are exactly its ``--tp`` ranks; then the model's heads and family
    (`elastic_bench.modeling.loading.check_placement`, on its config)."""
    from elastic_bench.modeling.loading import check_placement, torchrun_world_size

    world = torchrun_world_size()
    if world == 1 and cfg.tp > 1:
        raise ValueError(f"--tp {cfg.tp} needs torchrun: torchrun --nproc-per-node {cfg.tp} -m elastic_bench bench "
                         f"prefill --tp {cfg.tp} ...")
    if world != cfg.tp:
        raise ValueError(f"bench prefill times one model over every torchrun process: give --tp {world}, not --tp "
                         f"{cfg.tp}")
    check_placement(cfg.model, cfg.tp, world_size=world)


def run_prefill_bench(cfg: PrefillBenchConfig) -> dict[str, Any] | None:
    """Run the benchmark; returns ``{"device", "tp", "config", "results": [record, ...]}`` (under ``torchrun``, on rank
    0; None on the other ranks).

    A record has ``length, method`` and either ``error`` (the method failed at that length) or ``median_s, mean_s,
    times_s`` (seconds per forward), ``omega_msr, omega_esr``, ``attention_share``, ``speedup_vs_full``,
    ``speedup_vs_sdpa``, ``ceiling`` (the FLOPs bound; methods run through `apply`), ``omega_esr_model``,
    ``ideal_speedup``, ``fraction_of_ideal``, ``peak_gib`` (CUDA), and for the methods run through `apply`
    ``prefill_backends`` (backend → calls over the timed forwards), ``routing_seconds`` and ``routing_fraction`` (the
    time in the method's ``plan`` per forward, and its share of the forward), ``options``, ``method_stats`` (the
    method's own statistics), and where they apply ``estimation_seconds`` (the XAttention estimation of fa-xa and
    xa-ssa) and ``block_density`` (selected over causal key blocks of the BLOCK_SPARSE heads).
    """
    import tempfile

    from tqdm import tqdm

    from elastic_bench.modeling.interface import get_method
    from elastic_bench.modeling.loading import check_backend, check_device, load_model
    from elastic_bench.training.distributed import Ranks

    check_ranks(cfg)
    for name, knobs in cfg.knobs.items():  # every knob checked before the model loads
        get_method(name, **knobs)
    ranks = Ranks.from_env(cfg.device, cfg.tp)  # joins torchrun's process group
    device = check_device(ranks.device(cfg.device))
    check_backend(cfg.backend, device)
    names = [*REFERENCES, *(m for m in dict.fromkeys(cfg.methods) if m not in REFERENCES)]
    model, _ = load_model(cfg.model, device=device, tp=cfg.tp)
    bar = tqdm(total=len(cfg.lengths) * len(names) * (cfg.repeats + 1), desc="bench prefill",
               disable=not (cfg.progress and ranks.is_main), file=sys.stderr)
    records: list[dict[str, Any]] = []
    with torch.inference_mode(), tempfile.TemporaryDirectory(prefix="elastic-bench-prefill-") as scratch:
        for length in cfg.lengths:
            gen = torch.Generator().manual_seed(cfg.seed)
            ids = torch.randint(int(model.config.vocab_size), (1, length), generator=gen).to(device)
            found = _bench_length(names, model, ids, cfg, device, scratch, bar)
            add_ratios(found)
            records += found
            del ids
            if device.type == "cuda":
                torch.cuda.empty_cache()
    bar.close()
    if not ranks.is_main:
        return None
    return {"device": str(device), "tp": cfg.tp, "config": asdict(cfg), "results": records}


def _bench_length(names: list[str], model, ids: torch.Tensor, cfg: PrefillBenchConfig, device: torch.device,
                  scratch: str, bar) -> list[dict[str, Any]]:
    """Every method's record at one length: each method's warm-up forward, then ``cfg.repeats`` rounds of one timed
    forward per method, so that a drift of the device (its clock and temperature over a long sweep) reaches every
    method alike; a method that fails is recorded with its error and leaves the rounds."""
    length = int(ids.shape[1])
    entries: list[_Entry] = []
    errors: dict[str, str] = {}
    shard = tensor_parallel(model)

    def attempt(name: str, step: Callable[..., Any], *args: Any) -> Any:
        """``step(*args)``, or None with the error recorded for ``name`` when it failed here or, under tensor
        parallelism, on any rank (the first failing rank's error): the ranks keep taking the same steps."""
        result = error = None
        try:
            result = step(*args)
        except Exception as err:  # one failing method (e.g. out of memory) must not end the sweep; the table shows it
            error = f"{type(err).__name__}: {err}"[:300]
        if shard is not None:
            error = next((e for e in shard.gather(error) if e), None)
        if error is None:
            return result
        errors[name] = error
        if device.type == "cuda":  # after the except block: its traceback no longer holds tensors
            import gc

            gc.collect()
            torch.cuda.empty_cache()
        return None

    for name in names:
        bar.set_postfix_str(f"{length} {name} warm-up")
        entry = attempt(name, _Entry, name, model, ids, cfg, device, scratch)
        if entry is not None:
            attempt(name, entry.forward, None)
            if name in errors:
                entry.close()
            else:
                entries.append(entry)
        bar.update(cfg.repeats + 1 if name in errors else 1)
    for index in range(cfg.repeats):
        for entry in list(entries):
            bar.set_postfix_str(f"{length} {entry.name} {index + 1}/{cfg.repeats}")
            attempt(entry.name, entry.forward, index)
            if entry.name in errors:
                entries.remove(entry)
                entry.close()
                bar.update(cfg.repeats - index - 1)
            bar.update()
    records = []
    for name in names:
        record: dict[str, Any] = {"length": length, "method": name}
        entry = next((e for e in entries if e.name == name), None)
        if name in errors:
            record["error"] = errors[name]
        elif entry is not None:
            record.update(entry.record())
            entry.close()
        records.append(record)
    return records


class _Entry:
    """One method at one length: its method, stopwatch and plan timer, made once; each forward runs inside the
    method's context on its own (`forward`), so the benchmark can take the methods' timed forwards in rounds. The
    statistics of the timed forwards are pooled over their contexts."""

    def __init__(self, name: str, model, ids: torch.Tensor, cfg: PrefillBenchConfig, device: torch.device,
                 scratch: str):
        self.name, self.model, self.ids, self.cfg, self.device = name, model, ids, cfg, device
        self.stopwatch = Stopwatch(device)
        self.method: Method | None = None
        self.counter: BlockCounter | None = None
        if name not in ("floor", "sdpa"):
            self.method = build_method(name, model, cfg, scratch)
            self.counter = BlockCounter(self.method, self.stopwatch)
        self.per_sample: list[dict[str, float]] = []
        self.parts: list[dict[str, float]] = []  # each timed forward's parts (`MethodHandle.prefill_parts`)
        self.backends: dict[str, int] = {}
        self.method_stats: dict[str, Any] = {}  # the method's own statistics, from its last timed forward
        self.peak_gib = 0.0

    @contextmanager
    def _context(self) -> Iterator[Any]:
        """The model running this method: a `MethodHandle`, or None for the floor and sdpa."""
        if self.method is None:
            if self.name == "floor":
                from transformers import AttentionInterface

                AttentionInterface.register(FLOOR_ATTENTION, _no_attention)
            with attention_implementation(self.model, FLOOR_ATTENTION if self.name == "floor" else "sdpa"):
                yield None
            return
        from elastic_bench.modeling.attention import apply

        with apply(self.method, self.model, backend=self.cfg.backend, time_parts=True) as handle:
            yield handle

    @contextmanager
    def _synchronised(self, timed: bool) -> Iterator[None]:
        """The ranks of a tensor-parallel model meet (a barrier) before and after a timed forward, so each rank times
        the same forward from the same start; nothing in one process."""
        shard = tensor_parallel(self.model) if timed else None
        if shard is not None:
            torch.distributed.barrier(group=shard.group)
        yield
        if shard is not None:
            torch.distributed.barrier(group=shard.group)

    def forward(self, index: int | None) -> None:
        """One forward of the prompt: untimed (``index`` None: the warm-up, which compiles the kernels) or timed forward
        number ``index`` (CUDA events queued without synchronisation; perf_counter on the CPU)."""
        cuda = self.stopwatch.cuda
        with self._context() as handle:
            if index is not None and cuda:
                torch.cuda.reset_peak_memory_stats(self.device)
            self.stopwatch.forward = index
            try:
                with self._synchronised(index is not None), self.stopwatch.span("forward"):
                    out = self.model(input_ids=self.ids, logits_to_keep=1, use_cache=False)
                del out
            finally:
                self.stopwatch.forward = None
            if index is None:
                if cuda:
                    torch.cuda.synchronize(self.device)
                return
            if cuda:
                self.peak_gib = max(self.peak_gib, torch.cuda.max_memory_allocated(self.device) / 2**30)
            if handle is not None:
                stats = handle.stats()
                self.parts += handle.prefill_parts()
                self.per_sample += stats["per_sample"]
                for backend, calls in stats["prefill_backends"].items():
                    self.backends[backend] = self.backends.get(backend, 0) + calls
                self.method_stats = {k: v for k, v in stats.items() if k not in STAT_KEYS}

    def close(self) -> None:
        if self.counter is not None:
            self.counter.remove()

    def record(self) -> dict[str, Any]:
        """The timings and statistics of the timed forwards."""
        repeats, shard = self.cfg.repeats, tensor_parallel(self.model)
        spans = self.stopwatch.totals(repeats)
        if shard is not None:  # every rank calls `record` alike (collectives)
            spans = slowest(shard.gather(spans))
            self.peak_gib = max(shard.gather(self.peak_gib))
        times = spans["forward"]
        record: dict[str, Any] = {"median_s": statistics.median(times), "mean_s": statistics.mean(times),
                                  "times_s": times}
        if self.stopwatch.cuda:
            record["peak_gib"] = self.peak_gib
        if self.method is None:  # floor: every pair skipped; sdpa: every pair computed
            floor = self.name == "floor"
            return {**record, "omega_msr": float(floor), "omega_esr": float(floor), "attention_share": float(not floor)}
        means = sample_means(self.per_sample, MEASURES)
        parts = {name: statistics.mean(p[name] for p in self.parts) for name in PARTS}
        routing = statistics.median(p["routing"] + p["estimation"] + p["planning"] for p in self.parts)
        record.update({
            **means,
            "prefill_backends": self.backends,
            "routing_seconds": routing,
            "routing_fraction": routing / record["median_s"],
            "parts_s": parts,
            "unexplained_s": unexplained(record["mean_s"], parts),
            "options": self.method.options(),
            "method_stats": self.method_stats,
        })
        if parts["estimation"] > 0:
            record["estimation_seconds"] = statistics.median(p["estimation"] for p in self.parts)
        density = self.counter.density(shard)
        if density is not None:
            record["block_density"] = density
        if self.name == "elastic":
            record["mode"] = self.method.routers.config.attention.mode
        if self.name == "duo_attention" and self.cfg.pattern is None:  # not the temporary file's path, gone after
            record["options"]["pattern"] = f"seeded uniform gates (seed {self.cfg.seed})"
        return record


def slowest(per_rank: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    """The spans of the ranks of one model (`Stopwatch.totals` of each) merged: per name and timed forward, the slowest
    rank's seconds (a name some ranks lack from the ranks that have it)."""
    names = dict.fromkeys(name for spans in per_rank for name in spans)
    return {name: [max(column) for column in zip(*(spans[name] for spans in per_rank if name in spans))]
            for name in names}


def ideal_speedup(t_full: float, t_floor: float, attention_share: float) -> float:
    """t_full / (t_floor + (t_full − t_floor)·share): the speedup of a method whose attention costs exactly the share
    ``attention_share`` of the model's own attention (1 − ΩESR on a model of full layers), the rest of the forward
    unchanged."""
    return t_full / (t_floor + (t_full - t_floor) * attention_share)


def add_ratios(records: list[dict[str, Any]]) -> None:
    """Add ``speedup_vs_full``, ``speedup_vs_sdpa``, ``ideal_speedup`` and ``fraction_of_ideal`` to the records of one
    length (medians; a ratio whose reference failed is left out)."""
    timed = {r["method"]: r["median_s"] for r in records if "median_s" in r}
    t_full, t_floor, t_sdpa = timed.get("full"), timed.get("floor"), timed.get("sdpa")
    for r in records:
        if "median_s" not in r:
            continue
        if t_sdpa is not None:
            r["speedup_vs_sdpa"] = t_sdpa / r["median_s"]
        if t_full is None:
            continue
        r["speedup_vs_full"] = t_full / r["median_s"]
        if t_floor is not None and math.isfinite(r.get("attention_share", math.nan)):
            r["ideal_speedup"] = ideal_speedup(t_full, t_floor, r["attention_share"])
            r["fraction_of_ideal"] = r["speedup_vs_full"] / r["ideal_speedup"]


def _backend_label(r: dict[str, Any]) -> str:
    if r["method"] == "sdpa":
        return "transformers"
    if r["method"] == "floor":
        return "none"
    return "+".join(sorted(r.get("prefill_backends") or {})) or "-"


def format_table(report: dict[str, Any]) -> str:
    """Plain-text table of a `run_prefill_bench` report (with its ``provenance``, when the command line added it)."""
    head = (f"{'length':>7} {'method':14} {'median s':>9} {'mean s':>9} {'×full':>6} {'ceil':>6} {'ideal%':>6} "
            f"{'ΩMSR':>5} {'ΩESR':>5} {'route s':>8} {'route%':>6} {'backend':14} {'GiB':>6}  note")
    lines = [head, "-" * len(head)]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"{r['length']:>7} {r['method']:14} {'failed':>9}  {r['error']}")
            continue
        cell = functools.partial(formatted, r)
        notes = []
        if "block_density" in r:
            notes.append(f"block density {r['block_density']:.3f}")
        if "estimation_seconds" in r:
            notes.append(f"estimation {r['estimation_seconds']:.4f} s")
        if "mode" in r:
            notes.append(f"mode {r['mode']}")
        lines.append(
            f"{r['length']:>7} {r['method']:14} {r['median_s']:>9.4f} {r['mean_s']:>9.4f} "
            f"{cell('speedup_vs_full', '.2f'):>6} {cell('ceiling', '.2f'):>6} "
            f"{cell('fraction_of_ideal', '.0f', 100):>6} {cell('omega_msr', '.3f'):>5} {cell('omega_esr', '.3f'):>5} "
            f"{cell('routing_seconds', '.4f'):>8} "
            f"{cell('routing_fraction', '.1f', 100):>6} {_backend_label(r):14} {cell('peak_gib', '.1f'):>6}  "
            + ", ".join(notes)
        )
    return with_provenance(lines + parts_table(report["results"]), report)


def parts_table(records: list[dict[str, Any]]) -> list[str]:
    """The lines of the prefill taken apart: per method and length run through `apply`, the mean milliseconds of each
    part (`PARTS`) and of what they leave of the forward (``unexplained``, also as a share of the forward)."""
    parted = [r for r in records if "parts_s" in r]
    if not parted:
        return []
    head = f"{'length':>7} {'method':14} " + " ".join(f"{name:>10}" for name in PARTS) + f" {'unexpl.':>8} {'%':>5}"
    lines = ["", "prefill taken apart (mean ms per timed forward; unexpl.: the forward's mean less the parts' sum)",
             head, "-" * len(head)]
    for r in parted:
        parts = " ".join(f"{1000 * r['parts_s'][name]:>10.2f}" for name in PARTS)
        lines.append(f"{r['length']:>7} {r['method']:14} {parts} {1000 * r['unexplained_s']:>8.2f} "
                     f"{100 * r['unexplained_s'] / r['mean_s']:>5.1f}")
    return lines
