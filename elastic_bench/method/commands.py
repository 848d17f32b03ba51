"""The training commands of a frozen model: ``records`` (the router's training set for the model, `router_records`),
``train-router`` (Elastic Attention's routers, `trainer`) and ``train-duo`` / ``train-prulong`` (the baselines' head
gates, `elastic_bench.baselines.training`), as `elastic_bench.foundation.commands` records.

Each runs with its trainer's configuration and the engine's `RunOptions` (how the run executes); the records say
what the shared run options mean to each. The gate trainers' commands are declared here, not beside their trainers,
because importing the baselines package registers every baseline method, which loads torch, and
``elastic-bench --help`` must not wait for it.
"""

from __future__ import annotations

import argparse
import importlib
from functools import partial

from elastic_bench.foundation.commands import Command

RUN_OPTIONS = "elastic_bench.training.engine:RunOptions"
NOT_ON_THE_COMMAND_LINE = ("workers",)  # the trainers choose their data workers


def _records(command: Command, args: argparse.Namespace) -> int:
    from elastic_bench.method.router_records import write_router_records

    (config,) = command.configs_from(args)
    write_router_records(config)
    return 0


def _train_router(command: Command, args: argparse.Namespace) -> int:
    import os

    from elastic_bench.method.trainer import train
    from elastic_bench.modeling.loading import check_device

    config, options = command.configs_from(args)
    check_device(config.device)
    result = train(config, options)
    if os.environ.get("RANK", "0") != "0":
        return 0
    if not result.final_omega:
        print(f"router training stopped by --max-minutes: {options.output} (rerun the command to resume)")
        return 0
    omega = ", ".join(f"{c}: {v:.3f}" for c, v in result.final_omega.items())
    print(f"routers written to {options.output} (final hard ΩMSR per category: {omega})")
    return 0


def _train_gates(module: str, train: str, method: str, command: Command, args: argparse.Namespace) -> int:
    """Train gates with the function ``train`` of ``module``; ``method`` reads the exported gates."""
    import os

    import numpy as np

    from elastic_bench.baselines.training.base import fit_to_model
    from elastic_bench.modeling.loading import check_device

    config, options = command.configs_from(args)
    check_device(config.device)
    config, chosen = fit_to_model(config)
    main_rank = os.environ.get("RANK", "0") == "0"
    if chosen and main_rank:
        flags = " ".join(f"{command.flags.get(name, '--' + name.replace('_', '-'))} {value}"
                         for name, value in chosen.items())
        print(f"{command.name} chose for {config.model}: {flags}")
    gates, result = getattr(importlib.import_module(module), train)(config, options)
    if not main_rank:
        return 0
    if not result.complete:
        print(f"{command.name} stopped by --max-minutes at step {result.done}: {options.output} (rerun the command "
              "to resume)")
        return 0
    top = sorted(((float(v), layer, head) for (layer, head), v in np.ndenumerate(gates)), reverse=True)[:3]
    ranked = ", ".join(f"layer {layer} KV head {head}: {v:.3f}" for v, layer, head in top)
    print(f"gates written to {options.output}/full_attention_heads.tsv (highest: {ranked}); use "
          f"-O {method}.pattern={options.output}")
    return 0


def _gates(name: str, trainer: str, config: str, train: str, method: str, help: str, description: str) -> Command:
    """``train-duo`` / ``train-prulong``: the config class ``config`` and function ``train`` of the gate trainer
    module ``trainer``, whose gates the method ``method`` reads."""
    module = f"elastic_bench.baselines.training.{trainer}"
    return Command(
        name, help, description, partial(_train_gates, module, train, method),
        configs=(f"{module}:{config}", RUN_OPTIONS),
        flags={"local": "--local-window", "kind": "--data"},  # torchrun would take --local for its --local-addr
        skipped=NOT_ON_THE_COMMAND_LINE, defaults={"output": f"runs/{trainer}"},
        helps={"output": "output folder (gates, settings, log, training state); a rerun with the same one resumes.",
               "save_every": "steps between checkpoints (and exports)."},
    )


COMMANDS = (
    Command(
        "records", "write a router training set for a model (sensitive and robust tasks at its lengths)",
        "Write router training records for a model's tokenizer and context (its weights are not loaded): by default "
        "the paper's five task labels from sources no registered benchmark uses, sparsity-sensitive single- and "
        "multi-hop QA over invented facts and sparsity-robust summary leads, standard-library code completion and "
        "few-shot tagging, each labelled with its category, label and identities, at lengths spread over the "
        "model's context, over a corpus you give or generated reports (--tasks also takes RULER's generators and "
        "other tasks, which a router trained on them then is in-distribution for). Seeded: the same seed and model "
        "write the same file. Train on it with `elastic-bench train-router --data FILE`; docs/records.md says what "
        "each task is made of.",
        _records, configs=("elastic_bench.method.router_records:RecordsConfig",),
    ),
    Command(
        "train-router", "train Elastic Attention routers (frozen backbone)",
        "Train one Attention Router per layer of a frozen model, with per-category Lagrangian sparsity targets "
        "(Elastic Attention, arXiv 2601.17367). Writes router.safetensors + router_config.json, train_log.jsonl and a "
        "resume state to OUTPUT; re-running the same command resumes. Runs on one device, or under `torchrun "
        "--nproc-per-node N -m elastic_bench train-router ...` with FSDP2 over the backbone.",
        _train_router, configs=("elastic_bench.method.trainer:RouterTrainConfig", RUN_OPTIONS),
        flags={"targets": "--target", "local": "--local-window"},  # the flags of the recorded recipes
        skipped=NOT_ON_THE_COMMAND_LINE, defaults={"output": "runs/router"},
        helps={"output": "output directory (routers, log, training state); a rerun with the same one resumes.",
               "save_every": "steps between checkpoints."},
    ),
    _gates(
        "train-duo", "duo", "DuoTrainConfig", "train_duo", "duo_attention",
        "train DuoAttention's retrieval-head gates for a model (frozen backbone)",
        "Train one gate α per KV head (DuoAttention, arXiv 2410.10819; upstream's recipe): each head outputs "
        "α·full + (1 − α)·streaming, distilled from the same model with full attention on the final hidden states of "
        "synthetic multi-passkey retrieval, plus an L1 term on α. Writes full_attention_heads.tsv (rows = layers; "
        "-O duo_attention.pattern=OUTPUT), config.json, train_log.jsonl and a resume state to OUTPUT; re-running the "
        "same command resumes. One device, or torchrun with FSDP2 over the backbone.",
    ),
    _gates(
        "train-prulong", "prulong", "PruLongTrainConfig", "train_prulong", "prulong",
        "train PruLong's hard-concrete head masks for a model (frozen backbone)",
        "Train one hard-concrete mask per KV head (PruLong, arXiv 2506.17121; upstream's recipe): each head outputs "
        "z·full + (1 − z)·streaming, with the LM loss on every token plus a Lagrangian steering the head sparsity to "
        "--target (ramped from 0), on rows of natural text (--haystack, RULER's essays or generated; --data passkeys: "
        "DuoAttention's passkey data). Writes the 0/1 masks at --target as "
        "full_attention_heads.tsv (-O prulong.pattern=OUTPUT), log_alpha.tsv, config.json, train_log.jsonl and a "
        "resume state to OUTPUT; re-running the same command resumes.",
    ),
)
