"""What the two gate trainers share: the configuration fields, loading the frozen model, the gate files, the run.

A trainer subclasses `GateTrainConfig` (its own hyper-parameters and defaults) and `GateObjective` (its loss), and
calls `run_gate_training` with the engine's `RunOptions`, which fits the options left unset to the model
(`fit_to_model`: the kind of data, sample lengths, passkeys and the streaming window from its positions and tokenizer,
upstream's values where they fit), locks the output folder, loads and freezes the model,
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
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import nn

from elastic_bench.foundation.files import exclusive, write_json, write_table
from elastic_bench.kernels import torch_dtype
from elastic_bench.training.distributed import Ranks
from elastic_bench.training.engine import (
    Objective,
    RunOptions,
    RunResult,
    enable_gradient_checkpointing,
    fingerprint,
    fit,
)

from ..gates import GATES_FILE, SETTINGS_FILE
from .passkeys import PasskeyData, PasskeySamples, fit_passkeys


@dataclass
class GateTrainConfig:
    """Fields every gate trainer has (what is learned; how a run executes is `RunOptions`).

    Attributes:
        model: the frozen model (``tiny:llama``, ``testbed``, ``random:llama-3.1-8b``, a path or hub id).
        data: the training data (passkey retrieval, rows of text, or records: `PasskeyData`).
        steps: optimizer steps.
        batch_size: samples per optimizer step, over all ranks (a multiple of the number of ranks).
        sink: sink tokens of the streaming branch in training; None: the trainer's upstream value (`UPSTREAM_WINDOW`),
            halved with ``local`` while the two exceed half of the longest sample.
        local: window tokens of the streaming branch in training (the query's own token included); None: as ``sink``.
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
    sink: int | None = None
    local: int | None = None
    granularity: Literal["token", "block"] = "block"
    backend: str | None = None
    gradient_checkpointing: bool = False
    device: str | None = None
    dtype: Literal["bfloat16", "float16", "float32"] | None = None
    seed: int = 0

    UPSTREAM_WINDOW: ClassVar[tuple[int, int]]  # (sink, local) of the trainer's upstream recipe
    DEFAULT_KIND: ClassVar[str]  # `PasskeyData.kind` when unset: what the trainer's paper trains on

    def __post_init__(self):
        if isinstance(self.data, dict):
            self.data = PasskeyData(**self.data)
        checks = {
            "steps must be >= 1": self.steps >= 1,
            "batch_size must be >= 1": self.batch_size >= 1,
            "sink must be >= 0": self.sink is None or self.sink >= 0,
            "local must be >= 1": self.local is None or self.local >= 1,
            "seed must be >= 0": self.seed >= 0,
        }
        failed = [message for message, ok in checks.items() if not ok]
        if failed:
            raise ValueError("; ".join(failed))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def fit_window(sink: int | None, local: int | None, upstream: tuple[int, int], max_length: int) -> tuple[int, int]:
    """The streaming branch's ``(sink, local)``: given values kept; unset ones start at ``upstream`` and are halved
    while ``sink + local`` exceeds half of ``max_length`` (so that at least half of the longest sample lies outside
    the window)."""
    chosen_sink, chosen_local = upstream
    while chosen_sink + chosen_local > max_length // 2 and chosen_local > 1:
        chosen_sink, chosen_local = chosen_sink // 2, chosen_local // 2
    return (chosen_sink if sink is None else sink), (chosen_local if local is None else local)


def fit_to_model(config: GateTrainConfig, tokenizer=None) -> tuple[GateTrainConfig, dict[str, Any]]:
    """``config`` with every option left unset (None) chosen for its model's positions and tokenizer (the sample
    lengths and passkeys: `fit_passkeys`; the streaming window: `fit_window`), and ``{field: value}`` of what was
    chosen. Reads the model's config and tokenizer, not its weights.

    Raises:
        ValueError: given values that cannot hold (one line): ``max_length`` above the model's positions, passkeys
            that do not fit (see `fit_passkeys`).
    """
    from elastic_bench.modeling.loading import load_tokenizer, max_positions

    positions = max_positions(config.model)
    if config.data.max_length is not None and config.data.max_length > positions:
        raise ValueError(f"--max-length {config.data.max_length} exceeds the {positions} positions of {config.model}")
    kind = config.data.kind or (None if config.data.records else config.DEFAULT_KIND)
    data = fit_passkeys(dataclasses.replace(config.data, kind=kind), tokenizer or load_tokenizer(config.model),
                        positions)
    sink, local = fit_window(config.sink, config.local, config.UPSTREAM_WINDOW, data.max_length)
    fitted = dataclasses.replace(config, data=data, sink=sink, local=local)
    chosen = {f.name: getattr(data, f.name) for f in dataclasses.fields(data)
              if getattr(config.data, f.name) is None and getattr(data, f.name) is not None}
    chosen |= {name: getattr(fitted, name) for name in ("sink", "local") if getattr(config, name) is None}
    return fitted, chosen


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
    """Write the gates (``full_attention_heads.tsv``) and ``config.json`` into the output folder: the settings, the
    steps done, the data's sources, its ``provenance`` (`elastic_bench.training.provenance`: what `gate_provenance`
    reads for the held-out rule), versions, device and date."""
    from elastic_bench.results.provenance import provenance
    from elastic_bench.training.provenance import learned_provenance

    output = Path(objective.output)
    samples = objective.samples
    write_table(output / GATES_FILE, objective.gates(), objective.gate_format)
    write_json(output / SETTINGS_FILE, {
        **objective.config.to_dict(), "steps_done": step, **samples.settings(), **objective.settings(),
        "provenance": learned_provenance(samples.data_provenance(step), step,
                                         samples.tokens_seen(step)),
        **provenance(objective.device),
    })


def load_frozen(config: GateTrainConfig, device: torch.device) -> tuple[nn.Module, Any]:
    """``(model, tokenizer)``: the model loaded on ``device``, parameters frozen."""
    from elastic_bench.modeling.loading import load_model

    model, tokenizer = load_model(config.model, dtype=torch_dtype(config.dtype), device=device)
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
    config, _ = fit_to_model(config)
    ranks = Ranks.from_env(config.device)
    with exclusive(options.output, f"elastic-bench {objective_class.command}", enabled=ranks.is_main):
        return _run(config, objective_class, options, ranks)


def _run(config, objective_class, options, ranks):
    from elastic_bench.modeling.attention import apply
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


