"""The ``testbed`` commands: ``testbed train`` (`train`), ``data`` (`records`), ``eval`` (`evaluate`), ``heads`` and
``probe`` (`heads`), with the configs of those that have no other home (`elastic_bench.foundation.commands`
records; their heavy imports happen inside the handlers)."""

from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import dataclass, field

from elastic_bench.foundation.commands import Command, Group
from elastic_bench.foundation.options import check_at_least, check_file_output, check_lengths
from elastic_bench.method.commands import NOT_ON_THE_COMMAND_LINE, RUN_OPTIONS

from .. import STREAMING_LOCAL, STREAMING_SINK


def _check_device(device: str | None) -> None:
    from elastic_bench.modeling.loading import check_device

    check_device(device)


@dataclass
class TestbedDataConfig:
    """``elastic-bench testbed data``.

    Attributes:
        output: JSONL file to write.
        samples: records per task and length.
        lengths: comma-separated lengths in tokens.
        seed: record seed (the evaluation prompts use 42).
    """

    output: str
    samples: int = 64
    lengths: list[int] = field(default_factory=lambda: [1024, 2048, 4096])
    seed: int = 1

    def __post_init__(self):
        check_at_least("--samples", self.samples, 1)
        check_lengths("--lengths", self.lengths)
        check_at_least("--seed", self.seed, 0)
        check_file_output(self.output)


@dataclass
class TestbedEvalConfig:
    """``elastic-bench testbed eval``.

    Attributes:
        model: testbed, or a folder written by `testbed train`.
        samples: samples per task and length.
        lengths: comma-separated lengths in tokens.
        sink: streaming sink tokens.
        local: streaming window tokens.
        output: also write the results to this JSON file.
        device: cuda or cpu (none: cuda when available).
    """

    model: str = "testbed"
    samples: int = 100
    lengths: list[int] = field(default_factory=lambda: [1024, 2048, 4096])
    sink: int = STREAMING_SINK
    local: int = STREAMING_LOCAL
    output: str | None = None
    device: str | None = None

    def __post_init__(self):
        check_at_least("--samples", self.samples, 1)
        check_lengths("--lengths", self.lengths)
        check_at_least("--sink", self.sink, 0)
        check_at_least("--local", self.local, 1)
        if self.output is not None:
            check_file_output(self.output)
        _check_device(self.device)


@dataclass
class TestbedHeadsConfig:
    """``elastic-bench testbed heads``.

    Attributes:
        output: TSV file to write.
        model: testbed, or a folder written by `testbed train`.
        length: prompt length in tokens.
        samples: samples per head and task.
        tasks: comma-separated testbed tasks whose drop makes the gate (default: the sensitive ones).
        device: cuda or cpu (none: cuda when available).
    """

    output: str
    model: str = "testbed"
    length: int = 2048
    samples: int = 20
    tasks: list[str] = field(default_factory=lambda: ["niah_single", "niah_multikey"])
    device: str | None = None

    def __post_init__(self):
        check_at_least("--length", self.length, 1)
        check_at_least("--samples", self.samples, 1)
        check_file_output(self.output)
        _check_device(self.device)


@dataclass
class TestbedProbeConfig:
    """``elastic-bench testbed probe``.

    Attributes:
        model: testbed, or a folder written by `testbed train`.
        length: prompt length in tokens.
        samples: prompts.
        device: cuda or cpu (none: cuda when available).
    """

    model: str = "testbed"
    length: int = 1024
    samples: int = 16
    device: str | None = None

    def __post_init__(self):
        check_at_least("--length", self.length, 1)
        check_at_least("--samples", self.samples, 1)
        _check_device(self.device)


def _train(command: Command, args: argparse.Namespace) -> int:
    from elastic_bench.foundation.options import command_line
    from elastic_bench.testbed.training.train import TestbedTrainConfig, train

    options, config = command.configs_from(args)
    _check_device(config.device)
    line = shlex.join(["elastic-bench", "testbed", "train", "--output", options.output,
                       *command_line(TestbedTrainConfig, config)])
    record = train(config, options, line)
    state = "complete" if record["complete"] else f"stopped at step {record['steps_done']} (rerun to resume)"
    print(f"testbed training {state}: {options.output}")
    if "evaluation" in record:
        print(json.dumps({k: v["families"] for k, v in record["evaluation"].items() if isinstance(v, dict)
                          and "families" in v}))
    return 0


def _data(command: Command, args: argparse.Namespace) -> int:
    from elastic_bench.testbed.training.records import write_records

    (config,) = command.configs_from(args)
    count = write_records(config.output, config.lengths, config.samples, config.seed)
    print(f"{count} records written to {config.output}")
    return 0


def _eval(command: Command, args: argparse.Namespace) -> int:
    from elastic_bench.kernels import StreamingGeometry
    from elastic_bench.modeling.loading import load_model
    from elastic_bench.testbed.training.evaluate import exact_match, family_means
    from elastic_bench.testbed.vocab import build

    (config,) = command.configs_from(args)
    geometry = StreamingGeometry(config.sink, config.local)
    model, _ = load_model(config.model, device=config.device)
    vocab = build()
    results = {}
    for label, streaming in (("full", None), ("streaming", geometry)):
        found = exact_match(model, vocab, config.lengths, config.samples, streaming=streaming)
        results[label] = {"tasks": found, "families": family_means(found)}
        for task, per_length in found.items():
            cells = "  ".join(f"{length}: {pct:6.2f}" for length, pct in per_length.items())
            print(f"{label:9s} {task:24s} {cells}")
    if config.output:
        from elastic_bench.foundation.files import write_json

        write_json(config.output, {"model": config.model, "samples": config.samples, "sink": config.sink,
                                   "local": config.local, **results})
    return 0


def _heads(command: Command, args: argparse.Namespace) -> int:
    from elastic_bench.modeling.loading import load_model
    from elastic_bench.testbed.generators import SPECS
    from elastic_bench.testbed.training.heads import ablation_gates, write_gates
    from elastic_bench.testbed.vocab import build

    (config,) = command.configs_from(args)
    tasks = tuple(t.removeprefix("testbed_") for t in config.tasks)
    unknown = [t for t in tasks if t not in SPECS]
    if unknown:
        raise ValueError(f"unknown testbed tasks {unknown}; known: {list(SPECS)}")
    model, _ = load_model(config.model, device=config.device)
    gates = ablation_gates(model, build(), config.length, config.samples, tasks)
    write_gates(gates, config.output)
    print(gates.round(2))
    print(f"head gates written to {config.output}")
    return 0


def _probe(command: Command, args: argparse.Namespace) -> int:
    import numpy as np

    from elastic_bench.modeling.loading import load_model
    from elastic_bench.testbed.training.heads import best_head, key_matching
    from elastic_bench.testbed.vocab import build

    (config,) = command.configs_from(args)
    model, _ = load_model(config.model, device=config.device)
    selectivity = key_matching(model.float(), build(), config.length, config.samples)
    with np.printoptions(precision=2, suppress=True, linewidth=160):
        print(f"key-matching selectivity, layers x query heads ({config.samples} prompts, {config.length} tokens):")
        print(selectivity)
    best = best_head(selectivity)
    print(f"best head: layer {best['layer']}, query head {best['head']}, selectivity {best['selectivity']:.3f}")
    return 0


COMMANDS = (
    Group("testbed", "train, evaluate and make router data for the testbed model (a 6-layer Llama trained by "
                     "elastic-bench on synthetic long-context tasks, shipped as --model testbed)"),
    Command(
        "testbed train", "train the testbed model from scratch",
        "Train the testbed model: word-level tokenizer, task generators, context curriculum 256 → 4096, bf16 on the "
        "GPU; the defaults are the shipped checkpoint's recipe. Deterministic from --seed (deterministic kernels). "
        "Writes checkpoints, a log, and at the end the model (config.json, model.safetensors in bf16, tokenizer "
        "files) and TRAINING.json (command, versions, exact-match accuracies with full and streaming attention). "
        "Rerunning with the same --output resumes.",
        _train, configs=(RUN_OPTIONS, "elastic_bench.testbed.training.train:TestbedTrainConfig"),
        flags={"save_every": "--checkpoint-every"}, skipped=NOT_ON_THE_COMMAND_LINE, defaults={"save_every": 500},
        helps={"output": "folder for checkpoints, the log and the exported model.",
               "save_every": "steps between checkpoints (and between key-matching probes in the log); does not "
                             "change what is learned, so a resumed run may change it."},
    ),
    Command(
        "testbed data", "write router-training records (JSONL) from the testbed tasks",
        "Write {prompt, answer, category, task, identities} records (category: sensitive or robust) from every "
        "testbed task, for `elastic-bench train-router --model testbed`. Seeds differ from the evaluation prompts', "
        "but the generators are the tasks': a router trained on them is in-distribution for the testbed tasks.",
        _data, configs=(TestbedDataConfig,),
    ),
    Command(
        "testbed eval", "exact-match accuracy of a testbed model with full and streaming attention",
        "Teacher-forced greedy exact match on every testbed task (the prompts of `elastic-bench run --tasks "
        "testbed`), batched: with full attention, and with sink + window streaming on every head over the prompt and "
        "dense answer positions (a streaming prefill, then dense decode, as the harness runs it).",
        _eval, configs=(TestbedEvalConfig,),
    ),
    Command(
        "testbed heads", "find the retrieval heads by ablation and write DuoAttention-layout head gates",
        f"Switch each KV head alone to streaming (sink {STREAMING_SINK}, window {STREAMING_LOCAL}) and write the "
        "largest relative drop of exact match over --tasks as its gate (TSV, layers × KV heads), usable as "
        "-O duo_attention.pattern=FILE.",
        _heads, configs=(TestbedHeadsConfig,),
    ),
    Command(
        "testbed probe", "does a testbed model find a needle by its key? (per-head key-matching selectivity)",
        "At the question's key token of niah_multikey prompts, the attention mass each query head puts on the "
        "queried needle minus its mean mass on a distractor needle (layers × query heads). A model that retrieves by "
        "key has a head near 1; one that picks a needle by position has none.",
        _probe, configs=(TestbedProbeConfig,),
    ),
)
