"""``elastic-bench bench kernel``: time the hybrid-attention backends and the XAttention estimation at the shape of
Llama-3.1-8B (32 query / 8 KV heads, head_dim 128, bf16).

Design decisions:
- One run times every requested backend and dense `scaled_dot_product_attention` on the same inputs, so every ratio
  is within one run: speedup vs dense SDPA and vs ``flex`` on the same plan.
- Rates are effective TFLOP/s on attended pairs: ``4 · d · A / t`` with ``A`` the exact pair count of the plan over all
  query heads (`pair_counts`), so a sparse cell is not credited for work it skips.
- A call is timed end to end through `hybrid_attention`, its device work included (the SDPA gather of ``split``,
  and any wait a host read of the plan forces), except FlexAttention's `BlockMask`, which is built once per plan and
  reported apart as ``prep_ms`` (how FlexAttention is normally used and measured).
- Timing (the method of `triton.testing.do_bench`): one warm-up call (compilation), then at least 3 and at most
  ``--repeats`` calls within about a second, queued without synchronisation, each after a 256 MiB L2 flush and
  bracketed by CUDA events; the median. So a time is the call's device time: host launch work overlaps the queue, as
  in a model's forward, where every layer's attention is queued behind other kernels (wall clock on the CPU).
- ``--check`` compares every backend with the ``reference`` backend at lengths up to ``--check-max`` (relative
  Frobenius error), and the Triton XAttention selection with its PyTorch reference (fraction of differing blocks).
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

CELLS = ("dense", "streaming", "fa-ssa", "block-sparse", "three-way", "xattention")  # see KernelBenchConfig.cells
_PATTERNS = {"dense": "F", "streaming": "S", "fa-ssa": "FS", "block-sparse": "B", "three-way": "FSBFSBSB"}


@dataclass
class KernelBenchConfig:
    """What ``bench kernel`` measures (defaults: the attention shape of Llama-3.1-8B).

    Attributes:
        lengths: comma-separated sequence lengths in tokens (e.g. 8K,32K,128K).
        cells: comma-separated plans to time: dense (all KV heads FULL), streaming (all STREAMING, sink + local in
            block geometry), fa-ssa (even KV heads FULL, odd STREAMING), block-sparse (all BLOCK_SPARSE: first,
            diagonal and random blocks, `density` of the causal blocks), three-way (KV heads F S B F S B S B),
            xattention (the XAttention estimation alone: scoring, selection, CSR; stride 16, τ 0.9).
        backends: comma-separated backends (none: every one available on the device); dense SDPA always runs.
        batch: batch size.
        query_heads: query heads.
        kv_heads: KV heads.
        head_dim: head dimension.
        dtype: input dtype.
        density: block-sparse density of the causal blocks.
        sink: streaming sink tokens.
        local: streaming local-window tokens.
        check: compare every backend with the reference backend (relative error) and the XAttention selections with
            the reference selection.
        check_max: the longest length checked.
        repeats: most timed calls per measurement.
        seed: seed of the random inputs and block selections.
        device: cuda, cpu, cuda:1, ... (none: cuda when available).
        output: JSON file the results are written to.
        progress: show a progress bar.
    """

    lengths: list[int] = field(default_factory=lambda: [8192, 16384, 32768, 65536, 131072])
    cells: list[str] = field(default_factory=lambda: list(CELLS))
    backends: list[str] | None = None
    batch: int = 1
    query_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    density: float = 0.1
    sink: int = 128
    local: int = 2048
    check: bool = False
    check_max: int = 32768
    repeats: int = 10
    seed: int = 0
    device: str | None = None
    output: str = "runs/bench/kernel.json"
    progress: bool = True

    def __post_init__(self):
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        unknown = [c for c in self.cells if c not in CELLS]
        if unknown:
            raise ValueError(f"unknown cell(s) {', '.join(unknown)}; choose from: {', '.join(CELLS)}")
        if self.query_heads % self.kv_heads:
            raise ValueError(f"query heads ({self.query_heads}) must be a multiple of KV heads ({self.kv_heads})")
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError(f"lengths must be positive token counts, got {self.lengths}")
        if not 0 < self.density <= 1:
            raise ValueError(f"density must be in (0, 1], got {self.density}")


def cell_plan(cell: str, cfg: KernelBenchConfig, length: int, device, generator):
    """The `HeadPlan` of a cell for one length (block size 128, block-granular streaming geometry)."""
    import torch

    from .plan import BlockSelection, HeadPlan, Mode, StreamingGeometry

    letters = {"F": Mode.FULL, "S": Mode.STREAMING, "B": Mode.BLOCK_SPARSE}
    pattern = _PATTERNS[cell]
    modes = [int(letters[pattern[h % len(pattern)]]) for h in range(cfg.kv_heads)]
    modes = torch.tensor([modes] * cfg.batch, dtype=torch.uint8, device=device)
    blocks = None
    if (modes == Mode.BLOCK_SPARSE).any():
        blocks = BlockSelection.from_dense(random_blocks(cfg, length, device, generator))
    return HeadPlan(modes, StreamingGeometry(cfg.sink, cfg.local, "block"), blocks, block_size=128)


def random_blocks(cfg: KernelBenchConfig, length: int, device, generator):
    """Bool ``[B, Hq, nB, nB]``: block 0, the diagonal, and random causal blocks so each row keeps about
    ``density · (r + 1)`` blocks; one draw per KV head, shared by its query heads."""
    import torch

    n = -(-length // 128)
    r = torch.arange(n, device=device)[:, None]
    c = torch.arange(n, device=device)[None, :]
    p = ((cfg.density * (r + 1) - 2) / (r - 1).clamp(min=1)).clamp(0, 1)
    draw = torch.rand(cfg.batch, cfg.kv_heads, n, n, device=device, generator=generator) < p
    mask = (draw & (c > 0) & (c < r)) | (c == 0) | (c == r)
    return mask.repeat_interleave(cfg.query_heads // cfg.kv_heads, dim=1)


def time_call(fn, device, repeats: int) -> float:
    """Median milliseconds of ``fn()`` after one warm-up call, each call a span of a `DeviceTimer` (see the module
    doc)."""
    import torch

    from .timing import DeviceTimer

    timer = DeviceTimer(device)
    fn()
    if not timer.cuda:
        while len(timer.spans) < 3 or (len(timer.spans) < repeats and sum(timer.elapsed()) < 1.0):
            with timer.span():
                fn()
        return 1e3 * statistics.median(timer.elapsed())
    torch.cuda.synchronize(device)
    t = time.perf_counter()  # the host's wait for one call sets how many calls fit in about a second
    fn()
    torch.cuda.synchronize(device)
    n = max(3, min(repeats, int(1.0 / max(time.perf_counter() - t, 1e-6))))
    flush = torch.empty(2**28, dtype=torch.int8, device=device)  # 256 MiB written before every call: no L2 hits
    for _ in range(n):  # queued, no synchronisation in between: device time, host launch work hidden
        flush.zero_()
        with timer.span():
            fn()
    return 1e3 * statistics.median(timer.elapsed())


def _peak_gib(fn, device) -> float | None:
    import torch

    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(device) / 2**30


def _rel_error(out, ref) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm().clamp(min=1e-30))


def run_kernel_bench(cfg: KernelBenchConfig) -> dict[str, Any]:
    """Run the benchmark; returns ``{"device", "config", "results": [record, ...]}``.

    A record has ``length, cell, backend, ms`` and, where they apply, ``tflops`` (effective, attended pairs),
    ``speedup_vs_sdpa``, ``speedup_vs_flex``, ``prep_ms``, ``peak_gib``, ``rel_error`` (vs reference), ``error`` (a
    backend that failed), and for the XAttention cell ``fraction_of_dense``, ``density`` and ``mismatch`` (differing
    blocks vs the reference selection, as a fraction of the causal blocks).
    """
    import torch
    from tqdm import tqdm

    from .hybrid import available_backends

    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    usable = available_backends(device)
    backends = cfg.backends or [b for b in usable if b != "reference" or device.type == "cpu"]
    missing = [b for b in backends if b not in usable]
    if missing:
        raise ValueError(f"backend(s) {', '.join(missing)} not available on {device}; available: {', '.join(usable)}")
    xa_backends = ["triton", "gemm", "reference"] if device.type == "cuda" and "triton" in usable else ["reference"]
    attention_cells = [c for c in cfg.cells if c != "xattention"]
    steps = len(cfg.lengths) * (1 + len(attention_cells) * len(backends) + ("xattention" in cfg.cells))
    bar = tqdm(total=steps, desc="bench kernel", disable=not cfg.progress, file=sys.stderr)
    records: list[dict[str, Any]] = []
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    for length in cfg.lengths:
        records += _bench_length(cfg, length, backends, xa_backends, device, gen, bar)
    bar.close()
    return {"device": str(device), "config": asdict(cfg), "results": records}


def _bench_length(cfg: KernelBenchConfig, length: int, backends, xa_backends, device, gen, bar) -> list[dict[str, Any]]:
    """Records of every cell and backend at one length (inputs drawn once, shared by all)."""
    import torch
    import torch.nn.functional as F

    from .dtypes import torch_dtype
    from .hybrid import hybrid_attention
    from .sparsity import pair_counts

    records: list[dict[str, Any]] = []
    scale = cfg.head_dim**-0.5
    dtype = torch_dtype(cfg.dtype)
    shape_q = (cfg.batch, cfg.query_heads, length, cfg.head_dim)
    shape_kv = (cfg.batch, cfg.kv_heads, length, cfg.head_dim)
    q = torch.randn(shape_q, device=device, dtype=dtype, generator=gen)
    k = torch.randn(shape_kv, device=device, dtype=dtype, generator=gen)
    v = torch.randn(shape_kv, device=device, dtype=dtype, generator=gen)
    checking = cfg.check and length <= cfg.check_max
    attention_cells = [c for c in cfg.cells if c != "xattention"]

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)

    bar.set_postfix_str(f"{length} sdpa")
    dense_flops = 4 * cfg.head_dim * cfg.query_heads * cfg.batch * length * (length + 1) / 2
    sdpa_ms = time_call(sdpa, device, cfg.repeats)
    records.append({"length": length, "cell": "dense", "backend": "sdpa", "ms": sdpa_ms,
                    "tflops": dense_flops / sdpa_ms / 1e9, "speedup_vs_sdpa": 1.0,
                    "peak_gib": _peak_gib(sdpa, device)})
    bar.update()
    for cell in attention_cells:
        plan = cell_plan(cell, cfg, length, device, gen)
        pairs = pair_counts(plan, length, length, cfg.query_heads)
        flops = 4 * cfg.head_dim * float(pairs.attended.sum()) * (cfg.query_heads // cfg.kv_heads)
        ref = hybrid_attention(q, k, v, plan, scale, backend="reference") if checking else None
        cell_records = []
        for backend in backends:
            bar.set_postfix_str(f"{length} {cell} {backend}")
            record: dict[str, Any] = {"length": length, "cell": cell, "backend": backend}
            try:
                record.update(_measure_backend(backend, q, k, v, plan, scale, ref, flops, sdpa_ms, cfg, device))
            except Exception as err:  # one failing backend must not end the sweep; the table shows it
                record["error"] = f"{type(err).__name__}: {err}"[:300]
            cell_records.append(record)
            bar.update()
        flex_ms = next((r.get("ms") for r in cell_records if r["backend"] == "flex"), None)
        for record in cell_records:
            if flex_ms is not None and "ms" in record:
                record["speedup_vs_flex"] = flex_ms / record["ms"]
        records.extend(cell_records)
        del ref
    if "xattention" in cfg.cells:
        bar.set_postfix_str(f"{length} xattention")
        records += _bench_xattention(q, k, length, xa_backends, checking, sdpa_ms, cfg, device)
        bar.update()
    return records


def _bench_xattention(q, k, length, xa_backends, checking, sdpa_ms, cfg, device) -> list[dict[str, Any]]:
    """XAttention cell: every GPU scoring backend timed (the reference too when checking), each selection compared
    with the reference's."""
    from .xattention import xattention_select

    timed = [b for b in xa_backends if b != "reference"] or xa_backends
    causal = cfg.batch * cfg.query_heads * _causal_blocks(length)
    records, selections = [], {}
    for backend in xa_backends if checking else timed:

        def estimate(backend=backend):
            return xattention_select(q, k, 0.9, 16, 128, backend=backend)

        record: dict[str, Any] = {"length": length, "cell": "xattention", "backend": backend}
        try:
            selection = estimate()
            record["ms"] = time_call(estimate, device, cfg.repeats)
        except Exception as err:  # one failing backend must not end the sweep; the table shows it
            record["error"] = f"{type(err).__name__}: {err}"[:300]
        else:
            selections[backend] = selection
            record.update(fraction_of_dense=record["ms"] / sdpa_ms, density=selection.counts.sum().item() / causal)
        records.append(record)
    if "reference" in selections:
        n = -(-length // 128)
        ref = selections["reference"].to_dense(n)
        for record in records:
            if record["backend"] != "reference" and record["backend"] in selections:
                record["mismatch"] = float((selections[record["backend"]].to_dense(n) != ref).sum()) / causal
    return records


def _measure_backend(backend, q, k, v, plan, scale, ref, flops, sdpa_ms, cfg, device) -> dict[str, Any]:
    import torch

    from .hybrid import flex, hybrid_attention

    record: dict[str, Any] = {}
    if backend == "flex":
        t = time.perf_counter()
        mask = flex.build_block_mask(plan, q.shape[1], q.shape[2], k.shape[2], device)  # its cost, not a cached one
        if device.type == "cuda":
            torch.cuda.synchronize()
        record["prep_ms"] = (time.perf_counter() - t) * 1e3

        def call():
            return flex.flex_hybrid_attention(q, k, v, plan, scale, mask=mask)

    else:

        def call():
            return hybrid_attention(q, k, v, plan, scale, backend=backend)

    if ref is not None:
        record["rel_error"] = _rel_error(call(), ref)
    record["ms"] = time_call(call, device, cfg.repeats)
    record["tflops"] = flops / record["ms"] / 1e9
    record["speedup_vs_sdpa"] = sdpa_ms / record["ms"]
    record["peak_gib"] = _peak_gib(call, device)
    return record


def _causal_blocks(length: int) -> int:
    n = -(-length // 128)
    return n * (n + 1) // 2


def format_table(report: dict[str, Any]) -> str:
    """Plain-text table of a `run_kernel_bench` report (with its ``provenance`` added by the command line)."""
    head = f"{'length':>7} {'cell':13} {'backend':17} {'ms':>10} {'TFLOP/s':>8} {'xSDPA':>7} {'xflex':>6} {'err':>8} " \
           f"{'GiB':>6}  note"
    lines = [head, "-" * len(head)]
    for r in report["results"]:

        def fmt(key, spec, r=r):
            return format(r[key], spec) if r.get(key) is not None else ""

        note = ""
        if r["cell"] == "xattention" and "ms" in r:
            note = f"{100 * r['fraction_of_dense']:.2f}% of dense SDPA, density {r['density']:.3f}"
            if "mismatch" in r:
                note += f", {100 * r['mismatch']:.3f}% blocks differ from reference"
        elif "prep_ms" in r:
            note = f"BlockMask {r['prep_ms']:.1f} ms"
        if "error" in r:
            lines.append(f"{r['length']:>7} {r['cell']:13} {r['backend']:17} {'failed':>10}  {r['error']}")
            continue
        lines.append(
            f"{r['length']:>7} {r['cell']:13} {r['backend']:17} {r['ms']:>10.3f} {fmt('tflops', '.0f'):>8} "
            f"{fmt('speedup_vs_sdpa', '.2f'):>7} {fmt('speedup_vs_flex', '.2f'):>6} {fmt('rel_error', '.1e'):>8} "
            f"{fmt('peak_gib', '.1f'):>6}  {note}"
        )
    prov = report["provenance"]
    versions = ", ".join(f"{k} {v}" for k, v in prov["versions"].items() if v)
    code = f"code {prov.get('git_hash') or 'outside git'}, source digest {prov.get('source_digest')}"
    lines.append(f"{prov['date']} · {prov['device']} · {versions} · {code}")
    return "\n".join(lines)
