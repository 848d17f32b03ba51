"""``elastic-bench bench decode``: milliseconds per generated token after a long prompt, with the full and the
evicting KV cache, beside transformers' own SDPA decode and the bandwidth bound.

One process, one model, batch 1, bf16 on CUDA (fp32 on the CPU).

Design decisions:
- Per (method, length) one prefill of random token ids through `elastic_bench.apply` into a `DynamicCache`; each
  KV-cache variant then decodes from that prompt (restored after each variant): ``dynamic`` (transformers' cache,
  attended by the prefill kernels: the path before the packed cache), ``full`` (a `PackedCache` keeping every token)
  and ``evicting`` (streaming heads keep sink + window). The packed variants are packed from the prefill's cache by
  the method's decode plan, as the glue packs each layer after its prefill attention (`MethodHandle.pack_cache`).
  ``sdpa`` (the model's own SDPA attention over transformers' cache) decodes from the cache of the ``full`` method's
  prefill.
- Timing: ``--warmup`` untimed decode steps, then ``--steps`` steps, each one forward of a fixed random token
  bracketed by CUDA events and queued without synchronisation (perf_counter on the CPU); the median and the mean.
- Bytes: what the cache holds after the timed steps (`PackedCache.nbytes`: keys, values and slot positions; a
  `DynamicCache`'s tensors) beside a full cache of the same tokens. The bandwidth bound is the time to read the
  weights and the bytes this variant attends once at the device's memory bandwidth (``--bandwidth``; none: the
  nominal figure of known GPUs, else a measured device-to-device copy).
- ``--max-memory GIB``: at the largest length, each (method, cache) generates ``--generate`` tokens after a prefill
  through the harness's own path (packing during the prefill) under that memory budget
  (`torch.cuda.set_per_process_memory_fraction`); ``fits`` records whether it did, with the peak memory or the error.
"""

from __future__ import annotations

import functools
import statistics
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, get_args

import torch

from elastic_bench.bench import formatted, with_provenance, with_router
from elastic_bench.foundation.options import check_at_least
from elastic_bench.kernels.timing import DeviceTimer
from elastic_bench.modeling.choices import KVCache

METHODS = ("full", "duo_attention", "streaming", "elastic")
NOMINAL_BANDWIDTH = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0, "B200": 8000.0}  # GB/s, HBM spec sheets


@dataclass
class DecodeBenchConfig:
    """What ``bench decode`` measures.

    Attributes:
        model: model spec: random:llama-3.1-8b, random:qwen3-8b (random weights at the real shapes), tiny:llama, a
            local folder or a hub id.
        lengths: comma-separated prompt lengths in tokens (e.g. 32K,128K,256K).
        methods: comma-separated methods: full, duo_attention (seeded gates binarised at --omega-msr), streaming,
            elastic (needs --router; --router adds it); each decodes sparsely where it can. sdpa (transformers' own
            decode) always runs.
        kv_caches: comma-separated KV-cache variants per method: dynamic (transformers' cache), full (packed, every
            token), evicting (packed, streaming heads keep sink + window).
        omega_msr: the sparsity duo_attention binarises its gates at.
        router: Elastic router checkpoint folder: adds the elastic method (untrained: seeded untrained routers).
        backend: attention kernel backend passed to apply.
        warmup: untimed decode steps before the timed ones.
        steps: timed decode steps.
        decode_graphs: also time the packed caches with the decode step's small operations compiled and the step
            replayed as one CUDA graph (CUDA only).
        bandwidth: device memory bandwidth in GB/s for the bound (none: nominal for known GPUs, else measured).
        max_memory: GiB budget of the fit test at the largest length (none: no fit test; CUDA only).
        generate: tokens generated in the fit test.
        seed: seed of the token ids and the gates.
        device: cuda, cpu, cuda:1, ... (none: cuda when available).
        output: JSON file the results are written to.
        progress: show a progress bar.
    """

    model: str = "random:llama-3.1-8b"
    lengths: list[int] = field(default_factory=lambda: [32768, 131072, 262144])
    methods: list[str] = field(default_factory=lambda: ["full", "duo_attention"])
    kv_caches: list[str] = field(default_factory=lambda: ["dynamic", "full", "evicting"])
    omega_msr: float = 0.7
    router: str | None = None
    backend: str = "auto"
    warmup: int = 3
    steps: int = 32
    decode_graphs: bool = False
    bandwidth: float | None = None
    max_memory: float | None = None
    generate: int = 1024
    seed: int = 0
    device: str | None = None
    output: str = "runs/bench/decode.json"
    progress: bool = True

    def __post_init__(self):
        for name, values, valid in (("methods", self.methods, METHODS), ("kv_caches", self.kv_caches,
                                                                           get_args(KVCache))):
            unknown = [v for v in values if v not in valid]
            if unknown or not values:
                raise ValueError(f"--{name.replace('_', '-')}: unknown or none {unknown}; valid: {', '.join(valid)}")
        if not self.lengths or min(self.lengths) < 2:
            raise ValueError(f"lengths must be token counts >= 2, got {','.join(map(str, self.lengths)) or 'none'}")
        if not 0.0 <= self.omega_msr <= 1.0:  # NaN fails too
            raise ValueError(f"omega_msr must lie in [0, 1], got {self.omega_msr}")
        if self.warmup < 0 or self.steps < 1 or self.generate < 1:
            raise ValueError("warmup must be >= 0, steps and generate >= 1")
        if self.bandwidth is not None and not self.bandwidth > 0:
            raise ValueError(f"bandwidth must be positive GB/s, got {self.bandwidth}")
        if self.decode_graphs and self.warmup < 2:
            raise ValueError("--decode-graphs needs --warmup >= 2 (eager steps before the capture)")
        if self.max_memory is not None and not self.max_memory > 0:
            raise ValueError(f"max_memory must be positive GiB, got {self.max_memory}")
        check_at_least("--seed", self.seed, 0)
        self.methods = with_router(self.methods, self.router)


def _method(name: str, model, cfg: DecodeBenchConfig, scratch: str):
    from elastic_bench.bench.prefill import seeded_gates
    from elastic_bench.modeling.attention import attention_modules
    from elastic_bench.modeling.interface import get_method

    if name == "duo_attention":
        layers, heads = len(attention_modules(model)), int(model.config.num_key_value_heads)
        return get_method("duo_attention", pattern=str(seeded_gates(layers, heads, cfg.seed, scratch)),
                          sparsity=cfg.omega_msr)
    if name == "streaming":
        return get_method("streaming", sparse_decode=True)
    if name == "elastic":
        return get_method("elastic", router=cfg.router, sparse_decode=True)
    return get_method(name)


def bandwidth_gbs(device: torch.device, given: float | None) -> tuple[float, str]:
    """(GB/s, where the figure comes from): ``given``, the nominal figure of a known GPU, or a measured copy."""
    if given is not None:
        return given, "given"
    if device.type != "cuda":
        return float("nan"), "none (not a GPU)"
    name = torch.cuda.get_device_name(device)
    for gpu, gbs in NOMINAL_BANDWIDTH.items():
        if gpu in name:
            return gbs, f"nominal ({gpu})"
    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    timer = DeviceTimer(device)
    dst.copy_(src)
    with timer.span():
        for _ in range(10):
            dst.copy_(src)
    (seconds,) = timer.elapsed()
    return 2 * 10 * src.numel() / seconds / 1e9, "measured (device copy)"


def time_decode(model, cache, tokens: torch.Tensor, warmup: int, device: torch.device,
                graphs: bool = False) -> tuple[list[float], Any]:
    """Seconds of each of the timed decode steps (``tokens[warmup:]``) after the untimed ones; and the cache. The
    steps are queued without synchronisation, a `DeviceTimer` mark before each and one after the last, so a step's
    time runs from its mark to the next. With ``graphs``, every step runs the model's small operations compiled
    (`elastic_bench.modeling.fusion.fused_ops`) and the timed steps replay one CUDA graph of the step, captured after
    the untimed ones (`DecodeGraph`)."""
    import contextlib

    from elastic_bench.modeling.fusion import fused_ops
    from elastic_bench.modeling.generation import DecodeGraph
    from elastic_bench.modeling.kv_cache import cache_keyword, returned_cache

    name = cache_keyword(model)
    timer = DeviceTimer(device)
    marks = []
    graph = None
    with fused_ops(model) if graphs else contextlib.nullcontext():
        for i in range(tokens.shape[1]):
            if graphs and i == warmup:
                cache.reserve(tokens.shape[1] - i)
                graph = DecodeGraph(model, cache, cache.get_seq_length())
            if i >= warmup:
                marks.append(timer.mark())
            if graph is not None:
                graph.step(tokens[:, i])
            else:
                cache = returned_cache(model(input_ids=tokens[:, i : i + 1], use_cache=True, **{name: cache}))
    marks.append(timer.mark())
    return timer.elapsed(zip(marks, marks[1:])), cache


def _cache_bytes(cache) -> tuple[int, int]:
    from elastic_bench.modeling.kv_cache import PackedCache

    if isinstance(cache, PackedCache):
        return cache.nbytes(), cache.full_nbytes()
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    return held, held


def run_decode_bench(cfg: DecodeBenchConfig) -> dict[str, Any]:
    """Run the benchmark; returns ``{"device", "config", "bandwidth_gbs", "bandwidth_source", "results", "fit"}``.

    A result has ``length, method, kv_cache, graphs`` and either ``error`` or ``median_ms, mean_ms, times_ms`` (per
    decode step), ``kv_bytes``, ``kv_bytes_full``, ``kv_ratio``, ``bound_ms`` (weights + attended KV read once),
    ``x_bound``, ``speedup_vs_sdpa``, ``speedup_vs_full_cache`` (the same method's ``full`` variant) and
    ``omega_msr``.
    """
    import tempfile

    from tqdm import tqdm

    from elastic_bench.modeling.loading import check_backend, check_device, load_model

    device = check_device(cfg.device)
    check_backend(cfg.backend, device)
    if (cfg.max_memory is not None or cfg.decode_graphs) and device.type != "cuda":
        raise ValueError("--max-memory and --decode-graphs need a CUDA device")
    model, _ = load_model(cfg.model, device=device)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gbs, source = bandwidth_gbs(device, cfg.bandwidth)
    rows = len(dict.fromkeys(cfg.methods)) * len(_variants(cfg.kv_caches, cfg.decode_graphs)) + 1  # + sdpa
    bar = tqdm(total=len(cfg.lengths) * rows, desc="bench decode", disable=not cfg.progress,
               file=sys.stderr)
    results: list[dict[str, Any]] = []
    with torch.inference_mode(), tempfile.TemporaryDirectory(prefix="elastic-bench-decode-") as scratch:
        for length in cfg.lengths:
            gen = torch.Generator().manual_seed(cfg.seed)
            vocab = int(model.config.vocab_size)
            ids = torch.randint(vocab, (1, length), generator=gen).to(device)
            steps = torch.randint(vocab, (1, cfg.warmup + cfg.steps), generator=gen).to(device)
            found = []
            for method_name in dict.fromkeys(["full", *cfg.methods]):
                caches = [c for c in cfg.kv_caches if method_name in cfg.methods]
                found += _measure_method(method_name, caches, model, ids, steps, cfg, device, scratch, bar)
            for r in found:
                if "median_ms" in r:
                    r["bound_ms"] = 1000 * (weight_bytes + r["kv_bytes"]) / (gbs * 1e9)
                    r["x_bound"] = r["median_ms"] / r["bound_ms"]
            _add_ratios(found)
            results += found
            del ids
            if device.type == "cuda":
                torch.cuda.empty_cache()
    bar.close()
    fit = _fit_test(model, cfg, device) if cfg.max_memory is not None else None
    return {"device": str(device), "config": asdict(cfg), "bandwidth_gbs": gbs, "bandwidth_source": source,
            "weight_bytes": weight_bytes, "results": results, **({"fit": fit} if fit is not None else {})}


def _measure_method(name, caches, model, ids, steps, cfg, device, scratch, bar) -> list[dict[str, Any]]:
    """Prefill once with method ``name``, then decode with each cache variant (and sdpa after ``full``)."""
    from transformers import DynamicCache

    from elastic_bench.modeling.attention import apply, attention_implementation
    from elastic_bench.modeling.kv_cache import cache_keyword

    length = int(ids.shape[1])
    records = []
    method = _method(name, model, cfg, scratch)
    try:
        with apply(method, model, backend=cfg.backend, kv_cache="dynamic") as handle:
            prefill = DynamicCache()
            model(input_ids=ids, use_cache=True, logits_to_keep=1, **{cache_keyword(model): prefill})
            prompt = [(layer.keys, layer.values) for layer in prefill.layers]  # decode steps concatenate, not mutate
            omega = handle.stats()["omega_msr"]
            for variant, graphs in _variants(caches, cfg.decode_graphs):
                record = {"length": length, "method": name, "kv_cache": variant, "graphs": graphs, "omega_msr": omega}
                try:
                    cache = prefill if variant == "dynamic" else handle.pack_cache(prefill, evict=variant == "evicting")
                    times, cache = time_decode(model, cache, steps, cfg.warmup, device, graphs)
                    record.update(_timing(times, cache))
                    del cache
                except Exception as err:  # one failing variant (e.g. out of memory) must not end the sweep
                    record["error"] = f"{type(err).__name__}: {err}"[:300]
                _restore(prefill, prompt)
                records.append(record)
                bar.update()
        if name == "full":
            record = {"length": length, "method": "sdpa", "kv_cache": "dynamic", "graphs": False, "omega_msr": 0.0}
            with attention_implementation(model, "sdpa"):
                times, cache = time_decode(model, prefill, steps, cfg.warmup, device)
            record.update(_timing(times, cache))
            records.append(record)
            bar.update()
    except Exception as err:  # the prefill failed: every variant of the method is recorded with the error
        records += [{"length": length, "method": name, "kv_cache": c, "graphs": False,
                     "error": f"{type(err).__name__}: {err}"[:300]}
                    for c in caches if not any(r["kv_cache"] == c and r["method"] == name for r in records)]
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return records


def _variants(caches: list[str], graphs: bool) -> list[tuple[str, bool]]:
    """(cache, replayed as a CUDA graph) of each timed variant: every cache eager, then the packed ones graphed."""
    return [*((c, False) for c in caches), *((c, True) for c in caches if graphs and c != "dynamic")]


def _restore(cache, prompt) -> None:
    for layer, (keys, values) in zip(cache.layers, prompt):
        layer.keys, layer.values = keys, values


def _timing(times: list[float], cache) -> dict[str, Any]:
    held, full = _cache_bytes(cache)
    ms = [1000 * t for t in times]
    return {"median_ms": statistics.median(ms), "mean_ms": statistics.mean(ms), "times_ms": ms, "kv_bytes": held,
            "kv_bytes_full": full, "kv_ratio": held / full if full else None}


def _add_ratios(records: list[dict[str, Any]]) -> None:
    timed = {(r["method"], r["kv_cache"], r["graphs"]): r["median_ms"] for r in records if "median_ms" in r}
    sdpa = timed.get(("sdpa", "dynamic", False))
    for r in records:
        if "median_ms" not in r:
            continue
        if sdpa is not None:
            r["speedup_vs_sdpa"] = sdpa / r["median_ms"]
        full = timed.get((r["method"], "full", r["graphs"]))
        if full is not None:
            r["speedup_vs_full_cache"] = full / r["median_ms"]


def _fit_test(model, cfg: DecodeBenchConfig, device: torch.device) -> list[dict[str, Any]]:
    """Prefill + ``generate`` tokens at the largest length under the ``max_memory`` budget, per (method, cache)."""
    import gc
    import tempfile

    from elastic_bench.modeling.attention import apply
    from elastic_bench.modeling.generation import greedy_generate

    length = max(cfg.lengths)
    total = torch.cuda.get_device_properties(device).total_memory
    ids = torch.randint(int(model.config.vocab_size), (length,), generator=torch.Generator().manual_seed(cfg.seed))
    out = []
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(min(cfg.max_memory * 2**30 / total, 1.0), index)
    try:
        with tempfile.TemporaryDirectory(prefix="elastic-bench-decode-") as scratch:
            for name in dict.fromkeys(cfg.methods):
                for variant in cfg.kv_caches:
                    record: dict[str, Any] = {"length": length, "generate": cfg.generate, "method": name,
                                              "kv_cache": variant, "max_memory_gib": cfg.max_memory}
                    torch.cuda.reset_peak_memory_stats(device)
                    try:
                        with apply(_method(name, model, cfg, scratch), model, backend=cfg.backend,
                                   kv_cache=variant) as handle:
                            gen = greedy_generate(model, ids.tolist(), cfg.generate, set(), cfg.generate)
                            stats = handle.stats()
                        record.update(fits=True, tokens=len(gen.tokens),
                                      peak_gib=torch.cuda.max_memory_allocated(device) / 2**30,
                                      kv_bytes=stats.get("kv_bytes"), kv_bytes_full=stats.get("kv_bytes_full"))
                    except torch.cuda.OutOfMemoryError as err:
                        record.update(fits=False, error=f"out of memory: {str(err).splitlines()[0][:200]}")
                    except Exception as err:  # recorded; the other rows still run
                        record.update(fits=None, error=f"{type(err).__name__}: {err}"[:300])
                    gc.collect()
                    torch.cuda.empty_cache()
                    out.append(record)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)
    return out


def _cache_label(r: dict[str, Any]) -> str:
    return r["kv_cache"] + ("+graphs" if r.get("graphs") else "")


def format_table(report: dict[str, Any]) -> str:
    """Plain-text table of a `run_decode_bench` report (with its ``provenance``, when the command line added it)."""
    head = (f"{'length':>7} {'method':14} {'cache':15} {'ms/token':>9} {'mean':>8} {'×sdpa':>6} {'×full$':>6} "
            f"{'KV GiB':>7} {'KV ratio':>8} {'bound ms':>8} {'×bound':>6}")
    lines = [head, "-" * len(head)]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"{r['length']:>7} {r['method']:14} {_cache_label(r):15} {'failed':>9}  {r['error']}")
            continue
        cell = functools.partial(formatted, r)
        lines.append(f"{r['length']:>7} {r['method']:14} {_cache_label(r):15} {r['median_ms']:>9.2f} "
                     f"{r['mean_ms']:>8.2f} "
                     f"{cell('speedup_vs_sdpa', '.2f'):>6} {cell('speedup_vs_full_cache', '.2f'):>6} "
                     f"{r['kv_bytes'] / 2**30:>7.2f} {cell('kv_ratio', '.3f'):>8} {cell('bound_ms', '.2f'):>8} "
                     f"{cell('x_bound', '.1f'):>6}")
    lines.append(f"bandwidth {report['bandwidth_gbs']:.0f} GB/s ({report['bandwidth_source']}); ×full$: against the "
                 "same method's full (packed) cache, with graphs where the row has them")
    for r in report.get("fit", []):
        state = f"fits, peak {r['peak_gib']:.1f} GiB" if r["fits"] else f"does not fit ({r['error']})" \
            if r["fits"] is False else f"failed ({r['error']})"
        lines.append(f"fit {r['length']} + {r['generate']} tokens under {r['max_memory_gib']} GiB: {r['method']} "
                     f"{r['kv_cache']}: {state}")
    return with_provenance(lines, report)


__all__ = ["METHODS", "DecodeBenchConfig", "format_table", "run_decode_bench"]
