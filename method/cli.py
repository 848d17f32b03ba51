"""``elastic-bench train-router``: train Elastic Attention routers on a frozen model (imports nothing heavy)."""

from __future__ import annotations

import argparse
import os


def _target(value: str) -> tuple[str, float]:
    name, sep, raw = value.rpartition("=")
    try:
        target = float(raw)
    except ValueError:
        target = None
    if not sep or not name or target is None:
        raise argparse.ArgumentTypeError(f"targets look like CATEGORY=VALUE (e.g. 'Single QA=0.7'); got {value!r}")
    return name, target


def add_cli(sub) -> None:
    """Add the ``train-router`` subcommand to the CLI's subparsers."""
    p = sub.add_parser(
        "train-router",
        help="train Elastic Attention routers (frozen backbone)",
        description="Train one Attention Router per layer of a frozen model, with per-category Lagrangian sparsity "
        "targets (Elastic Attention, arXiv 2601.17367). Writes router.safetensors + router_config.json, "
        "train_log.jsonl and a resume state to OUTPUT; re-running the same command resumes. Runs on one device, or "
        "under `torchrun --nproc-per-node N -m elastic_bench train-router ...` with FSDP2 over the backbone.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", default="tiny:qwen3", help="tiny:qwen3, tiny:llama, testbed, a local path or hub id")
    p.add_argument(
        "--data", default="synthetic",
        help="JSONL/parquet file or directory of records ({prompt, answer, category} or the official {context, "
        "question, answer, metadata: {task, is_prefix}}), or 'synthetic' for generated sensitive/robust records",
    )
    p.add_argument("--output", default="runs/router", help="output directory")
    p.add_argument("--mode", default="fa-ssa", choices=["fa-ssa", "fa-xa", "xa-ssa"], help="full side / sparse side")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps")
    p.add_argument(
        "--target", type=_target, action="append", metavar="CATEGORY=VALUE",
        help="target ΩMSR of a category (repeatable; replaces the default table: 'Single QA', 'MultiHop QA', "
        "sensitive = 0.7; Summarization, Code, 'In-Context Learning', robust = 1.0)",
    )
    p.add_argument("--rows-per-step", type=int, default=8, help="packed rows per step over all ranks (global batch)")
    p.add_argument("--pack-tokens", type=int, default=65536, help="tokens per packed row")
    p.add_argument("--max-tokens", type=int, help="per-sample token cap, middle-truncating the prompt "
                   "(default: --pack-tokens)")
    p.add_argument("--router-lr", type=float, default=5e-4, help="router learning rate")
    p.add_argument("--lambda-lr", type=float, default=1e-3, help="Lagrange multiplier learning rate (ascent)")
    p.add_argument("--lambda-weight-decay", type=float, default=0.0, help="λ weight decay (official: 0.1)")
    p.add_argument("--tau-schedule", default="exponential", choices=["exponential", "cosine"],
                   help="Gumbel temperature schedule: paper exp decay or the official cosine 1.5 → 1.0 over 60%%")
    p.add_argument("--penalty", default="signed", choices=["signed", "abs"],
                   help="linear Lagrangian term λ1·(Ω−t) (paper) or λ1·|Ω−t| (official)")
    p.add_argument("--loss-tokens", default="answer", choices=["all", "answer"],
                   help="tokens of the LM loss: the answer's (default) or all (official code)")
    p.add_argument("--relaxation", default="softmax", choices=["softmax", "sigmoid"],
                   help="2-logit Gumbel-softmax router (paper, released checkpoints) or 1-logit Gumbel-sigmoid "
                   "(App. F)")
    p.add_argument("--pooling", default="boundary", choices=["boundary", "mean"],
                   help="router pooling: first+last 100 prompt keys, or all prompt keys")
    p.add_argument("--train-pooling", choices=["boundary", "mean"],
                   help="pooling during training only (mean: the official training's whole-prompt mean)")
    p.add_argument("--center-features", action="store_true",
                   help="center the router's pooled keys by their per-(layer, KV head) mean over training prompts "
                   "(computed once with full attention, saved with the routers)")
    p.add_argument("--sink", type=int, default=128, help="streaming sink tokens")
    p.add_argument("--local-window", type=int, default=2048, help="streaming local-window tokens (query included)")
    p.add_argument("--granularity", default="block", choices=["block", "token"], help="streaming granularity")
    p.add_argument("--xa-threshold", type=float, default=0.9, help="XAttention threshold τ (official eval: 0.8)")
    p.add_argument("--backend", help="differentiable attention backend (default: reference on CPU, flex on CUDA)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="recompute decoder layers in backward")
    p.add_argument("--device", help="cuda, cpu, ... (default: cuda when available)")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], help="backbone dtype")
    p.add_argument("--seed", type=int, default=0, help="seed of initialisation, row order and Gumbel noise")
    p.add_argument("--save-every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(handler=_train_router)


def _train_router(args) -> int:
    from elastic_bench.method.modes import ModeConfig
    from elastic_bench.method.trainer import TrainConfig, train

    options = dict(
        model=args.model, data=args.data, output=args.output, steps=args.steps, rows_per_step=args.rows_per_step,
        pack_tokens=args.pack_tokens, max_tokens=args.max_tokens, router_lr=args.router_lr, lambda_lr=args.lambda_lr,
        lambda_weight_decay=args.lambda_weight_decay, tau_schedule=args.tau_schedule, penalty=args.penalty,
        loss_tokens=args.loss_tokens, pooling=args.pooling, relaxation=args.relaxation,
        train_pooling=args.train_pooling, center_features=args.center_features, backend=args.backend,
        gradient_checkpointing=args.gradient_checkpointing,
        device=args.device, dtype=args.dtype, seed=args.seed, save_every=args.save_every,
        attention=ModeConfig(args.mode, args.sink, args.local_window, args.granularity, xa_threshold=args.xa_threshold),
    )
    if args.target:
        options["targets"] = dict(args.target)
    result = train(TrainConfig(**options), progress=not args.no_progress)
    if os.environ.get("RANK", "0") == "0":
        omega = ", ".join(f"{c}: {v:.3f}" for c, v in result.final_omega.items())
        print(f"routers written to {args.output} (final hard ΩMSR per category: {omega})")
    return 0
