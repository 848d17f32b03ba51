"""Where a router-training step's GPU time goes: `train-router` run for a few steps under torch.profiler, its CUDA
kernels summed by kind (matrix products, FlexAttention's forward and backward templates, other fused Triton
kernels, the rest), beside the steps' wall time.

    python docs/bench/profile_router_step.py --model random:llama-3.1-8b --pack-tokens 65536 --rows-per-step 1 \\
        --synthetic-samples 2 --synthetic-length 64000 --gradient-checkpointing --steps 3

Prints one table; the run's folder is a temporary one. The figures it gave are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import tempfile
from collections import defaultdict

KINDS = (  # (kind, pattern over a kernel's name), the first match wins
    ("flex backward", r"flex.*backward|tem_fused.*bwd|_bwd"),
    ("flex forward", r"flex|triton_tem"),
    ("matrix products", r"gemm|nvjet|cutlass|xmma|sm90|cublas"),
    ("fused Triton kernels", r"^triton_"),
)


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if re.search(pattern, name, re.I)), "other kernels")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="random:llama-3.1-8b")
    parser.add_argument("--pack-tokens", type=int, default=65536)
    parser.add_argument("--rows-per-step", type=int, default=1)
    parser.add_argument("--synthetic-samples", type=int, default=2)
    parser.add_argument("--synthetic-length", type=int, default=64000)
    parser.add_argument("--data", default="synthetic")
    parser.add_argument("--backend", default=None)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from elastic_bench.method.trainer import RouterTrainConfig, train
    from elastic_bench.modeling.loading import load_model
    from elastic_bench.training.engine import RunOptions

    config = RouterTrainConfig(
        model=args.model, data=args.data, steps=args.steps, rows_per_step=args.rows_per_step,
        pack_tokens=args.pack_tokens, synthetic_samples=args.synthetic_samples,
        synthetic_length=args.synthetic_length, backend=args.backend,
        gradient_checkpointing=args.gradient_checkpointing, eval_samples=1,
        targets={"sensitive": 0.7, "robust": 1.0},
    )
    loaded = load_model(args.model, dtype=torch.bfloat16, device="cuda")
    with tempfile.TemporaryDirectory() as folder:  # warm-up: compilation
        train(dataclasses.replace(config, steps=1), RunOptions(output=folder, save_every=10**6, progress=False),
              loaded=loaded)
    with tempfile.TemporaryDirectory() as folder, profile(activities=[ProfilerActivity.CUDA]) as prof:
        result = train(config, RunOptions(output=folder, save_every=10**6, progress=False), loaded=loaded)
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if event.device_type.name == "CUDA" or us:
            totals[kind_of(event.key)] += us / 1e6
    steps = [r["seconds"] for r in result.log]
    print(f"steps: {len(steps)}, wall seconds per step: {', '.join(f'{s:.2f}' for s in steps)}; "
          f"tokens per step {result.log[-1]['tokens']}, FLOPs per step {result.log[-1]['flops']:.3e}")
    print("kernel time over the run (steps + final evaluation), seconds:")
    for kind, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:22s} {seconds:8.2f}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=70))


if __name__ == "__main__":
    main()
