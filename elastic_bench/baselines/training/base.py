"""What the two gate trainers share: the configuration fields, loading the frozen model, the gate files, the run.

A trainer subclasses `GateTrainConfig` (its own hyper-parameters and defaults) and `GateObjective` (its loss), and
calls `run_gate_training` with the engine's `RunOptions`, which locks the output folder, loads and freezes the model,
builds the passkey data, runs the training engine (`elastic_bench.training.engine.fit`) under `GatedHeads` attention
and exports at every checkpoint:
``full_attention_heads.tsv`` (rows = layers, columns = KV heads: what ``duo_attention pattern=DIR`` and ``prulong
pattern=DIR`` read) and ``config.json`` (the run's settings, steps done, the data's sources, provenance).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from elastic_bench.foundation.files import exclusive, write_json, write_table
from elastic_bench.training.distributed import Ranks
from elastic_bench.training.engine import (
    Objective,
    RunOptions,
    RunResult,
    enable_gradient_checkpointing,
    fingerprint,
    fit,
)

from ..gates import GATES_FILE
from .passkeys import PasskeyData, PasskeySamples

SETTINGS_FILE = "config.json"


@dataclass
class GateTrainConfig:
    """Fields every gate trainer has (what is learned; how a run executes is `RunOptions`).

    Attributes:
        model: the frozen model (``tiny:llama``, ``testbed``, ``random:llama-3.1-8b``, a path or hub id).
        data: the passkey-retrieval training data.
        steps: optimizer steps.
        batch_size: samples per optimizer step, over all ranks (a multiple of the number of ranks).
        sink: sink tokens of the streaming branch in training.
        local: window tokens of the streaming branch in training (the query's own token included).
        granularity: ``block`` (Block-Sparse-Attention's block streaming, as upstream trains) or ``token``.
        backend: differentiable attention backend (``reference`` or ``flex``); None: reference on CPU, flex on CUDA.
        gradient_checkpointing: recompute the decoder layers in backward (less memory, one more forward).
        device: where the model runs; None: CUDA when available (one GPU per rank under ``torchrun``).
        dtype: the model's dtype (``bfloat16``, ``float16``, ``float32``); None: bf16 on CUDA, fp32 on CPU.
        seed: the sample stream and the trainer's noise.
    """

    model: str = "tiny:llama"
    data: PasskeyData = field(default_factory=PasskeyData)
    steps: int = 2000
    batch_size: int = 1
    sink: int = 128
    local: int = 256
    granularity: Literal["token", "block"] = "block"
    backend: str | None = None
    gradient_checkpointing: bool = False
    device: str | None = None
    dtype: Literal["bfloat16", "float16", "float32"] | None = None
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.data, dict):
            self.data = PasskeyData(**self.data)
        checks = {
            "steps must be >= 1": self.steps >= 1,
            "batch_size must be >= 1": self.batch_size >= 1,
            "sink must be >= 0": self.sink >= 0,
            "local must be >= 1": self.local >= 1,
            "seed must be >= 0": self.seed >= 0,
        }
        failed = [message for message, ok in checks.items() if not ok]
        if failed:
            raise ValueError("; ".join(failed))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class GateObjective(Objective):
    """A gate trainer's objective; `run_gate_training` builds it with ``(config, output, model, samples, device,
    ranks)``, ``output`` the run's folder.

    Besides `Objective`'s attributes it has ``gates()``, the ``[L, H]`` values exported as ``full_attention_heads.tsv``,
    and ``settings()``, what ``config.json`` records beyond the configuration.
    """

    command: str = ""  # the trainer's command, e.g. "train-duo"
    two_way: bool = False  # DuoAttention's teacher/student forward (`GatedHeads.two_way`)
    gate_format: str = "%.18e"  # numpy.savetxt format of the exported gates (upstream DuoAttention's)
    loading_seconds: float | None = None  # set by `run_gate_training`: loading the model and the data

    def __init__(self, config: GateTrainConfig, output: str, model: nn.Module, samples: PasskeySamples,
                 device: torch.device, ranks: Ranks):
        self.config, self.output, self.model, self.samples = config, output, model, samples
        self.device, self.ranks = device, ranks

    def gates(self) -> np.ndarray:
        raise NotImplementedError

    def settings(self) -> dict[str, Any]:
        return {"trainer": self.command, "loading_seconds": self.loading_seconds}

    def timed(self, record: dict[str, Any]) -> dict[str, Any]:
        """``record`` plus the step's ``seconds`` (since ``self.began``) and, on CUDA, ``max_memory_gib``."""
        record["seconds"] = time.perf_counter() - self.began
        if self.device.type == "cuda":
            record["max_memory_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return record

    def save(self, step: int) -> None:
        export(self, step)


def export(objective: GateObjective, step: int) -> None:
    """Write the gates (``full_attention_heads.tsv``) and ``config.json`` into the output folder."""
    from elastic_bench.results.provenance import provenance

    output = Path(objective.output)
    write_table(output / GATES_FILE, objective.gates(), objective.gate_format)
    write_json(output / SETTINGS_FILE, {
        **objective.config.to_dict(), "steps_done": step, **objective.samples.settings(), **objective.settings(),
        **provenance(objective.device),
    })


def load_frozen(config: GateTrainConfig, device: torch.device) -> tuple[nn.Module, Any]:
    """``(model, tokenizer)``: the model loaded on ``device``, parameters frozen."""
    from elastic_bench.modeling.loading import load_model

    dtype = getattr(torch, config.dtype) if config.dtype else None
    model, tokenizer = load_model(config.model, dtype=dtype, device=device)
    model.requires_grad_(False)
    if config.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model, tokenizer


def run_gate_training(config: GateTrainConfig, objective_class: type[GateObjective],
                      options: RunOptions) -> tuple[GateObjective, RunResult]:
    """Train (or resume) gates as configured into ``options.output``; returns the objective and the engine's result.

    Args:
        config: what is learned.
        objective_class: the trainer's objective.
        options: how the run executes (folder, checkpoint interval, time limit, progress bar on rank 0).
    """
    ranks = Ranks.from_env(config.device)
    with exclusive(options.output, f"elastic-bench {objective_class.command}", enabled=ranks.is_main):
        return _run(config, objective_class, options, ranks)


def _run(config, objective_class, options, ranks):
    from elastic_bench.modeling.attention import apply, attention_modules
    from elastic_bench.modeling.loading import check_device
    from elastic_bench.training.engine import shard, training_backend

    from .mixing import GatedHeads

    if config.batch_size % ranks.world_size:
        raise ValueError(f"batch_size={config.batch_size} is not a multiple of the {ranks.world_size} ranks")
    began = time.perf_counter()
    device = check_device(ranks.device(config.device))
    backend = training_backend(config.backend, device)  # refused before the model loads
    model, tokenizer = load_frozen(config, device)
    device = next(model.parameters()).device  # with its index (``cuda`` → ``cuda:0``)
    layers = [m.layer_idx for m in attention_modules(model)]
    if layers != list(range(len(layers))):
        raise ValueError(f"{objective_class.command} needs attention layers numbered 0…L-1, got {layers}")
    samples = PasskeySamples(config.data, tokenizer, config.seed, config.batch_size, ranks.rank, ranks.world_size)
    objective = objective_class(config, options.output, model, samples, device, ranks)
    if ranks.world_size > 1:
        shard(objective.root, model, device)
    method = GatedHeads(config.sink, config.local, config.granularity, objective_class.two_way)
    objective.loading_seconds = time.perf_counter() - began
    with apply(method, model, backend=backend) as handle:
        objective.handle = handle
        run = fit(objective, options, config.steps, fingerprint(config.to_dict()), ranks,
                  desc=objective_class.command)
    ranks.barrier()
    return objective, run


