"""The ``bench`` commands: ``bench kernel`` (`elastic_bench.kernels.bench`), ``bench prefill`` (`prefill`) and
``bench decode`` (`decode`), one handler for the three (`elastic_bench.foundation.commands` records)."""

from __future__ import annotations

import argparse
import importlib
import shlex
from functools import partial

from elastic_bench.foundation.commands import Command, Group
from elastic_bench.foundation.options import check_file_output


def _run_bench(module: str, run: str, command: Command, args: argparse.Namespace) -> int:
    """Run the benchmark function ``run`` of ``module`` on the command's config; print its table (the module's
    ``format_table``) and write its JSON with the provenance and the command line added (a benchmark returns None on
    the ranks of a ``torchrun`` that do not report). With ``--baseline`` the cells more than ``--tolerance`` slower
    than the baseline's on the same device are printed and recorded (``regressions``), and the status is 1."""
    from elastic_bench.foundation.files import check_writable, write_json
    from elastic_bench.modeling.loading import check_device
    from elastic_bench.results.provenance import provenance

    from .regression import compare, format_regressions

    config, guard = command.configs_from(args)
    check_device(config.device)
    check_file_output(config.output)
    check_writable(config.output)  # a folder that refuses the file, found before the benchmark runs
    baseline = guard.load()  # before the benchmark runs: a bad file is one line, not minutes lost
    bench = importlib.import_module(module)
    report = getattr(bench, run)(config)
    if report is None:  # a torchrun rank other than the first: rank 0 prints and writes
        return 0
    report = {"provenance": provenance(report["device"]), "command": "elastic-bench " + shlex.join(args.argv),
              **report}
    print(bench.format_table(report))
    flagged = []
    if baseline is not None:
        flagged, summary = compare(report, baseline, guard.tolerance)
        report["regressions"] = {"baseline": guard.baseline, "tolerance": guard.tolerance, "summary": summary,
                                 "cells": [{**r.key, "unit": r.unit, "baseline": r.before, "now": r.now}
                                           for r in flagged]}
        print(f"regression guard: {summary}")
        if flagged:
            print(format_regressions(flagged))
    write_json(config.output, report)
    print(f"results: {config.output}")
    return 1 if flagged else 0


def _bench(leaf: str, module: str, config: str, run: str, help: str, description: str) -> Command:
    """``bench LEAF``: the benchmark ``module``'s config class ``config`` and its function ``run``."""
    return Command(f"bench {leaf}", help, description, partial(_run_bench, module, run),
                   configs=(f"{module}:{config}", "elastic_bench.bench.regression:RegressionConfig"))


COMMANDS = (
    Group("bench", "micro-benchmarks that print a table and write JSON"),
    _bench(
        "kernel", "elastic_bench.kernels.bench", "KernelBenchConfig", "run_kernel_bench",
        "time hybrid-attention backends against dense SDPA and FlexAttention",
        "Time every hybrid-attention backend available on the device, dense scaled_dot_product_attention and the "
        "XAttention estimation. Prints a table (ms, effective TFLOP/s on attended pairs, speedup vs dense SDPA and vs "
        "flex) and writes JSON with the versions and the device.",
    ),
    _bench(
        "prefill", "elastic_bench.bench.prefill", "PrefillBenchConfig", "run_prefill_bench",
        "time a model's prefill under each method beside full attention and the no-attention floor",
        "Time one prefill forward of random token ids (batch 1, logits_to_keep=1, no cache; bf16 on CUDA) under the "
        "floor (attention replaced by a no-op: what no sparse method can beat), the model's own SDPA, the full method "
        "and each of --methods: every method's untimed warm-up forward, then --repeats rounds of one timed forward "
        "per method in turn. Prints a table (median and mean seconds, speedup vs full, fraction of the ideal speedup "
        "t_full / (t_floor + (t_full - t_floor)(1 - ΩESR)), ΩMSR, ΩESR, routing time, kernel backend, peak memory) "
        "and writes JSON with the versions and the device. A method that fails is recorded with its error. Under "
        "torchrun --nproc-per-node N with --tp N the model is sharded over the N ranks as run --tp shards it, each "
        "timed forward between barriers of the ranks; rank 0 prints and writes.",
    ),
    _bench(
        "decode", "elastic_bench.bench.decode", "DecodeBenchConfig", "run_decode_bench",
        "time decode steps after a long prompt: full and evicting KV caches beside transformers' SDPA",
        "Prefill random token ids once per method and length (batch 1; bf16 on CUDA), then time --steps decode "
        "forwards (after --warmup) with each --kv-caches variant: dynamic (transformers' cache), full (packed, every "
        "token) and evicting (streaming heads keep sink + window); transformers' own SDPA decode is the reference "
        "row. Prints ms per token (median, mean), the speedups, the KV bytes held against a full cache, and the "
        "bandwidth bound (weights + attended KV read once); with --max-memory, whether a prompt of the largest length "
        "plus --generate tokens fits under that budget. Writes JSON with the versions and the device.",
    ),
)
