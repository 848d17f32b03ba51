"""``elastic-bench testbed {train,data,eval,heads,probe}``: train the testbed model, write router-training records,
evaluate, find its retrieval heads, probe its key matching.

Heavy imports happen inside the handlers.
"""

from __future__ import annotations

import json
import shlex
import sys


def add_cli(sub) -> None:
    """Add the ``testbed`` command group to the top-level subparsers."""
    import argparse

    from elastic_bench.cli import _lengths

    group = sub.add_parser(
        "testbed", help="train, evaluate and make router data for the testbed model",
        description="The testbed is a 6-layer Llama (6.8M parameters) trained by elastic-bench on synthetic "
        "long-context tasks (needle retrieval that needs full attention; local tasks that do not), shipped with the "
        "package as --model testbed.",
    )
    commands = group.add_subparsers(dest="testbed_command", required=True, metavar="SUBCOMMAND")

    p = commands.add_parser(
        "train", help="train the testbed model from scratch",
        description="Train the testbed model: word-level tokenizer, task generators, context curriculum 256 → 4096, "
        "bf16 on the GPU; the defaults are the shipped checkpoint's recipe. Deterministic from --seed (deterministic "
        "kernels). Writes checkpoints, a log, and at the end the model (config.json, model.safetensors in bf16, "
        "tokenizer files) and TRAINING.json (command, versions, exact-match accuracies with full and streaming "
        "attention). Rerunning with the same --output resumes.",
    )
    p.add_argument("--output", required=True, help="folder for checkpoints and the exported model")
    p.add_argument("--seed", type=int, default=1, help="initialisation and data seed (default 1)")
    p.add_argument("--steps", type=int, default=7500, help="optimiser steps (default 7500)")
    p.add_argument("--batch-tokens", type=int, default=65536, help="tokens per step (default 65536)")
    p.add_argument("--max-length", type=int, default=4096, help="longest curriculum length (default 4096)")
    p.add_argument("--eval-samples", type=int, default=100,
                   help="samples per task and length of the final evaluation (default 100; 0: none)")
    p.add_argument("--min-length", type=int, default=256, help="first curriculum length (default 256)")
    p.add_argument("--stage-fraction", type=float, default=0.06,
                   help="fraction of the steps spent at each curriculum length (default 0.06)")
    p.add_argument("--mix-weights", type=_floats, metavar="W,W,W",
                   help="after the curriculum, the weights of the last curriculum lengths, shortest first (default "
                   "0.25,0.25,0.5: 1K, 2K, 4K)")
    p.add_argument("--curriculum-needles", type=int, default=4,
                   help="during the curriculum, niah_multikey hides up to this many needles (length // 64 at most, "
                   "4 at least; default 4)")
    p.add_argument("--context-weight", type=float, default=0.0,
                   help="loss weight of the instruction and context tokens, a light language-modelling loss on the "
                   "text (answers weigh 1, questions 0.1; default 0)")
    p.add_argument("--key-aux-weight", type=float, default=0.0,
                   help="weight of an auxiliary loss that predicts each needle's key from its first value token "
                   "(a training-only head; trains the key-writing half of key matching; default 0: none)")
    p.add_argument("--value-aux-weight", type=float, default=0.0,
                   help="weight of an auxiliary loss that predicts, at each question's key token, the first value "
                   "token of the needle with that key (the matching half of key matching; at 1 on the GPU it "
                   "stopped the model learning to copy answers, TRAINING.md; default 0: none)")
    p.add_argument("--attention-aux-weight", type=float, default=1.0,
                   help="weight of an auxiliary loss on the attention of three query heads: layer 1 head 1 attends "
                   "from each needle's first value token to its key, layer 3 head 1 from each question's key token to "
                   "that needle's first value token, layer 5 head 1 from each answer position to the context token it "
                   "copies (default 1; 0: none)")
    p.add_argument("--end-slack", type=int, default=16,
                   help="end each training sequence up to this many tokens early, padded after its </s>, so that "
                   "answers are not closed by absolute position (default 16)")
    p.add_argument("--first-token-weight", type=float, default=1.0,
                   help="loss weight of each answer's first token, the one that names the needle (default 1)")
    p.add_argument("--streaming-fraction", type=float, default=0.2,
                   help="share of the post-curriculum steps trained under sink-16 + window-256 streaming (default 0.2)")
    p.add_argument("--streaming-tasks", choices=("all", "robust"), default="all",
                   help="the tasks of those steps: the whole mixture or its robust tasks (default all)")
    p.add_argument("--dense-decode", action=argparse.BooleanOptionalAction, default=True,
                   help="in those steps the answer positions attend densely, as the harness decodes after a streaming "
                   "prefill (default; --no-dense-decode: streaming on every position)")
    p.add_argument("--lr", type=float, default=1.5e-3, help="peak learning rate (default 1.5e-3)")
    p.add_argument("--task-weights", type=_weights, metavar="TASK=W,...",
                   help="sampling weights of the tasks after the curriculum (default "
                   "niah_multikey=0.45,repeat=0.2,niah_recent=0.2,niah_single=0.15)")
    p.add_argument("--curriculum-task-weights", type=_weights, metavar="TASK=W,...",
                   help="task weights during the curriculum (default niah_multikey=1: key matching forms before "
                   "the positional tasks join; give the --task-weights mix to train it from the start)")
    p.add_argument("--rope-theta", type=float, default=10000.0, help="the model's RoPE base (default 10000)")
    p.add_argument("--nondeterministic", action="store_true",
                   help="allow PyTorch's non-deterministic GPU kernels (faster backward; runs then differ bit for bit)")
    p.add_argument("--init-from", help="start from this exported testbed model instead of a seeded initialisation")
    p.add_argument("--max-minutes", type=float, help="stop after this many minutes (checkpointed; rerun to resume)")
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(handler=_train)

    p = commands.add_parser(
        "data", help="write router-training records (JSONL) from the testbed tasks",
        description="Write {prompt, answer, category} records (category: sensitive or robust) from every testbed "
        "task, for `elastic-bench train-router --model testbed`. Seeds differ from the evaluation prompts'.",
    )
    p.add_argument("--output", required=True, help="JSONL file to write")
    p.add_argument("--samples", type=int, default=64, help="records per task and length (default 64)")
    p.add_argument("--lengths", type=_lengths, default=[1024, 2048, 4096], help="lengths in tokens (default 1K,2K,4K)")
    p.add_argument("--seed", type=int, default=1, help="record seed (default 1)")
    p.set_defaults(handler=_data)

    p = commands.add_parser(
        "eval", help="exact-match accuracy of a testbed model with full and streaming attention",
        description="Teacher-forced greedy exact match on every testbed task (the prompts of `elastic-bench run "
        "--tasks testbed`), batched: with full attention, and with sink + window streaming on every head over the "
        "prompt and dense answer positions (a streaming prefill, then dense decode, as the harness runs it).",
    )
    p.add_argument("--model", default="testbed", help="testbed (default) or a folder written by `testbed train`")
    p.add_argument("--samples", type=int, default=100, help="samples per task and length (default 100)")
    p.add_argument("--lengths", type=_lengths, default=[1024, 2048, 4096], help="lengths in tokens (default 1K,2K,4K)")
    p.add_argument("--sink", type=int, default=16, help="streaming sink tokens (default 16)")
    p.add_argument("--local", type=int, default=256, help="streaming window tokens (default 256)")
    p.add_argument("--output", help="also write the results to this JSON file")
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.set_defaults(handler=_eval)

    p = commands.add_parser(
        "heads", help="find the retrieval heads by ablation and write DuoAttention-layout head gates",
        description="Switch each KV head alone to streaming (sink 16, window 256) and write the largest relative "
        "drop of exact match over --tasks as its gate (TSV, layers × KV heads), usable as "
        "-O duo_attention.pattern=FILE.",
    )
    p.add_argument("--output", required=True, help="TSV file to write")
    p.add_argument("--model", default="testbed", help="testbed (default) or a folder written by `testbed train`")
    p.add_argument("--length", type=_lengths, default=[2048], help="prompt length in tokens (default 2K)")
    p.add_argument("--samples", type=int, default=20, help="samples per head and task (default 20)")
    p.add_argument("--tasks", default="niah_single,niah_multikey",
                   help="testbed tasks whose drop makes the gate (default: the sensitive ones)")
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.set_defaults(handler=_heads)

    p = commands.add_parser(
        "probe", help="does a testbed model find a needle by its key? (per-head key-matching selectivity)",
        description="At the question's key token of niah_multikey prompts, the attention mass each query head puts "
        "on the queried needle minus its mean mass on a distractor needle (layers × query heads). A model that "
        "retrieves by key has a head near 1; one that picks a needle by position has none.",
    )
    p.add_argument("--model", default="testbed", help="testbed (default) or a folder written by `testbed train`")
    p.add_argument("--length", type=_lengths, default=[1024], help="prompt length in tokens (default 1K)")
    p.add_argument("--samples", type=int, default=16, help="prompts (default 16)")
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.set_defaults(handler=_probe)


def _weights(value: str) -> dict[str, float]:
    import argparse

    try:
        return {name.strip(): float(w) for name, _, w in (item.partition("=") for item in value.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(f"task weights look like niah_multikey=0.5,repeat=0.2: {value!r}") from None


def _floats(value: str) -> tuple[float, ...]:
    import argparse

    try:
        return tuple(float(w) for w in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"weights look like 0.25,0.25,0.5: {value!r}") from None


def train_config(args) -> tuple:
    """The `TrainConfig` of parsed ``testbed train`` arguments, and the options it was built from (name → value)."""
    from .train import TrainConfig

    options = dict(seed=args.seed, steps=args.steps, batch_tokens=args.batch_tokens, min_length=args.min_length,
                   max_length=args.max_length, stage_fraction=args.stage_fraction, lr=args.lr,
                   eval_samples=args.eval_samples, init_from=args.init_from, rope_theta=args.rope_theta,
                   curriculum_needles=args.curriculum_needles, context_weight=args.context_weight,
                   key_aux_weight=args.key_aux_weight, value_aux_weight=args.value_aux_weight,
                   attention_aux_weight=args.attention_aux_weight, end_slack=args.end_slack,
                   first_token_weight=args.first_token_weight, streaming_fraction=args.streaming_fraction,
                   streaming_tasks=args.streaming_tasks, dense_decode=args.dense_decode)
    for name in ("mix_weights", "task_weights", "curriculum_task_weights"):
        if getattr(args, name):
            options[name] = getattr(args, name)
    return TrainConfig(**options, deterministic=not args.nondeterministic), options


def _train(args) -> int:
    from .train import train

    if args.max_minutes is not None and args.max_minutes <= 0:
        raise ValueError(f"--max-minutes must be positive, got {args.max_minutes}")
    config, options = train_config(args)
    words = ["elastic-bench", "testbed", "train", "--output", args.output]
    for key, value in options.items():
        flag = f"--{key.replace('_', '-')}"
        if isinstance(value, bool):  # a --flag / --no-flag switch
            words.append(flag if value else f"--no-{flag[2:]}")
        elif value is not None:
            words += [flag, ",".join(f"{k}={w}" for k, w in value.items()) if isinstance(value, dict)
                      else ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]
    command = shlex.join(words + ["--nondeterministic"] * args.nondeterministic)
    record = train(config, args.output, args.device, args.max_minutes, command, progress=not args.no_progress)
    state = "complete" if record["complete"] else f"stopped at step {record['steps_done']} (rerun to resume)"
    print(f"testbed training {state}: {args.output}")
    if "evaluation" in record:
        print(json.dumps({k: v["families"] for k, v in record["evaluation"].items() if isinstance(v, dict)
                          and "families" in v}))
    return 0


def _data(args) -> int:
    from .data import write_records

    if args.samples < 1:
        raise ValueError(f"--samples must be at least 1, got {args.samples}")
    count = write_records(args.output, args.lengths, args.samples, args.seed)
    print(f"{count} records written to {args.output}")
    return 0


def _eval(args) -> int:
    from elastic_bench.kernels import StreamingGeometry
    from elastic_bench.models import load_model

    from .evaluate import exact_match, family_means
    from .vocab import build

    model, _ = load_model(args.model, device=args.device)
    vocab = build()
    results = {}
    for label, geometry in (("full", None), ("streaming", StreamingGeometry(args.sink, args.local))):
        tasks = exact_match(model, vocab, args.lengths, args.samples, streaming=geometry)
        results[label] = {"tasks": tasks, "families": family_means(tasks)}
        for task, per_length in tasks.items():
            cells = "  ".join(f"{length}: {pct:6.2f}" for length, pct in per_length.items())
            print(f"{label:9s} {task:24s} {cells}", file=sys.stdout)
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"model": args.model, "samples": args.samples, "sink": args.sink, "local": args.local,
                       **results}, f, indent=2)
    return 0


def _heads(args) -> int:
    from elastic_bench.models import load_model

    from .generators import SPECS
    from .heads import ablation_gates, write_gates
    from .vocab import build

    if len(args.length) != 1 or args.samples < 1:
        raise ValueError("--length takes one length and --samples must be at least 1")
    tasks = tuple(t.strip().removeprefix("testbed_") for t in args.tasks.split(","))
    unknown = [t for t in tasks if t not in SPECS]
    if unknown:
        raise ValueError(f"unknown testbed tasks {unknown}; known: {list(SPECS)}")
    model, _ = load_model(args.model, device=args.device)
    gates = ablation_gates(model, build(), args.length[0], args.samples, tasks)
    write_gates(gates, args.output)
    print(gates.round(2))
    print(f"head gates written to {args.output}")
    return 0


def _probe(args) -> int:
    import numpy as np

    from elastic_bench.models import load_model

    from .heads import best_head, key_matching
    from .vocab import build

    if len(args.length) != 1 or args.samples < 1:
        raise ValueError("--length takes one length and --samples must be at least 1")
    model, _ = load_model(args.model, device=args.device)
    selectivity = key_matching(model.float(), build(), args.length[0], args.samples)
    with np.printoptions(precision=2, suppress=True, linewidth=160):
        print(f"key-matching selectivity, layers x query heads ({args.samples} prompts, {args.length[0]} tokens):")
        print(selectivity)
    best = best_head(selectivity)
    print(f"best head: layer {best['layer']}, query head {best['head']}, selectivity {best['selectivity']:.3f}")
    return 0
