"""The evaluation runner: cells = model × method × task × length, each written to the results store.

Design decisions:
- Config layering: `RunConfig` defaults → YAML file → command-line flags, each value type-checked, the whole validated
  in ``__post_init__`` (unknown methods, method options, tasks and backends fail before the model loads).
- Samples of a (task, length) are generated once and shared by every method, so methods see identical prompts.
- Greedy generation. With ``batch_size`` 1 (the paper's setting) every prompt runs alone and its prefill is timed.
  Larger batches: the cell's first ``timed_samples`` prompts are prefilled with nothing else pending after the warm-up
  and alone give the cell's prefill times; the prompts run ``batch_size`` at a time (each routed on its own tokens)
  and give the cell's ``samples_per_second`` and ``decode_ms_per_token`` at that batch, never a prefill time. With
  decode graphs a batch's prompts are prefilled one at a time into the batch's static cache (the timed ones are the
  first batch's first rows) and decode together, finished rows riding along; without them a batch is prefilled
  left-padded, finished rows leave it, and the timed prompts run alone before the batches. Predictions, scores,
  sparsity and KV bytes are those of batch 1. Follow-up turns (chain of thought) run alone.
- Under ``torchrun`` every rank (one GPU each) takes every W-th remaining sample of a cell; rank 0 merges the
  predictions and writes the metrics.
- Every timed prefill is taken apart (`elastic_bench.kernels.timing.PARTS`: ``prefill_parts`` per prediction, their
  means and the unexplained remainder per cell).
- With budgets (`elastic-bench calibrate`, `elastic_bench.evaluation.calibration`) every method but ``full`` is one
  configuration per budget; a task's first samples at a length calibrate its knob, the next ones are its cells'.
- A cell that fails (out of memory, a malformed record, a missing corpus) is recorded as failed with its error; the
  run goes on. Complete cells are skipped; interrupted cells resume from their last written prediction.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from elastic_bench import tasks as task_registry
from elastic_bench.evaluation import calibration
from elastic_bench.evaluation.calibration import Budget, BudgetConfig, Calibration
from elastic_bench.evaluation.held_out import artifact_provenance, in_distribution, refuse_in_distribution
from elastic_bench.evaluation.presets import applies, get_preset
from elastic_bench.evaluation.presets import label as preset_label
from elastic_bench.evaluation.terminal import summary_row
from elastic_bench.foundation.files import StorageError
from elastic_bench.foundation.options import check_fields, check_lengths, check_value
from elastic_bench.foundation.registry import check_declared, did_you_mean
from elastic_bench.modeling.choices import METHODS_GROUP, KVCache
from elastic_bench.results.store import Cell

if TYPE_CHECKING:
    from elastic_bench.modeling.interface import Method
    from elastic_bench.modeling.loading import ModelSource
    from elastic_bench.tasks import Sample, Task
    from elastic_bench.training.distributed import Ranks

# Per-sample values averaged into a cell's metrics (``prefill_seconds`` over the prompts timed alone).
MEANS = ("omega_msr", "omega_esr", "omega_esr_last_row", "omega_esr_model", "attention_share", "ceiling",
         "prefill_seconds", "kv_bytes", "kv_bytes_full")
CPU_AUTO_BATCH = 4  # what ``batch_size: auto`` means on the CPU (no memory probe there)
MAX_AUTO_BATCH = 64  # the largest batch ``auto`` tries on CUDA
WARM_TOKENS = 256  # prompt tokens of the batch that warms a batch shape's decode graph


@dataclass
class RunConfig:
    """What to evaluate (the options of ``elastic-bench run``; a ``--config`` YAML file holds the same fields).

    Attributes:
        model: tiny:qwen3, tiny:llama, testbed, random:llama-3.1-8b, random:qwen3-8b, a local model folder, a GGUF
            file (or a folder holding one) or a hub id.
        methods: comma-separated method names (see `elastic-bench methods`).
        method_options: per-method knobs, ``{"streaming": {"local": 256}}`` (on the command line: ``-O
            streaming.local=256``).
        preset: a settings preset giving every method the options one source ran it with: elastic-paper, upstream
            or official-code (`elastic-bench methods --preset NAME` prints them, docs/presets.md cites them); the
            method options override it, and the result folders of the methods it sets name it.
        tasks: comma-separated task or group names (see `elastic-bench tasks`).
        lengths: comma-separated target lengths in tokens, prompt plus generation budget (e.g. 4K,8K).
        limit: samples per task and length (none: the task's default).
        seed: sample-generation seed.
        output: run folder; results go to OUTPUT/<model>/<method>/<task>/<length>/.
        data_dir: local folder of benchmark corpora (LongBench, RULER essays/SQuAD/HotpotQA, ...); none:
            $ELASTIC_BENCH_DATA, then the Hugging Face hub where it holds the official files.
        backend: attention kernel backend: auto, reference, triton, split, flex, ... (`auto`: the fastest available
            for each call).
        kv_cache: what generation decodes with: ``evicting`` (a packed cache; heads a method decodes as streaming keep
            sink + window only), ``full`` (a packed cache keeping every token, as upstream) or ``dynamic``
            (transformers' DynamicCache attended by the prefill kernels).
        decode_graphs: decode with the model's small operations compiled, the steps replayed as a CUDA graph captured
            once per batch shape of a cell (CUDA and a packed cache; a batch's prompts are prefilled one at a time).
        batch_size: prompts generated together (each routed on its own); ``auto``: the largest batch of the cell's
            longest prompt that fits on the GPU, found once per length (halved when a batch runs out of memory), 4 on
            the CPU. A cell's batches are as even as they can be. Predictions, scores, sparsity and KV bytes are those
            of batch 1.
        timed_samples: with batches, the first N prompts of each cell are prefilled with nothing else pending and give
            its prefill times; the batches give samples_per_second and decode_ms_per_token.
        device: cuda, cpu, cuda:1, ... (none: cuda when available).
        dtype: model weights dtype (none: bfloat16 on CUDA, float32 on the CPU).
        progress: show progress bars.
        strict: stop when a cell's files do not prove themselves (a torn or edited predictions.jsonl, a config.json
            missing under predictions) instead of computing the cell again.
        allow_extrapolation: run lengths beyond the positions the model was trained for (its
            max_position_embeddings); recorded in each cell.
        allow_in_distribution: score a task with a router or gate file trained on data of the task's generator or
            dataset (refused otherwise); recorded in each cell, whose in_distribution field names what they share.
        tp: tensor parallelism under torchrun: the model sharded over this many ranks by transformers' plan, each
            rank attending and planning its own heads; records equal a single process's. torchrun's processes are tp
            × dp: dp replicas share out the samples.
        device_map: auto: the model's layers spread over the GPUs of this host by accelerate (one process).
    """

    model: str = "tiny:qwen3"
    methods: list[str] = field(default_factory=lambda: ["full", "streaming"])
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    preset: str | None = None
    tasks: list[str] = field(default_factory=lambda: ["ruler_niah_single_1"])
    lengths: list[int] = field(default_factory=lambda: [1024, 2048])
    limit: int | None = None
    seed: int = 42
    output: str = "runs/latest"
    data_dir: str | None = None
    backend: str = "auto"
    kv_cache: KVCache = "evicting"
    decode_graphs: bool = False
    batch_size: int | Literal["auto"] = 1
    timed_samples: int = 3
    device: str | None = None
    dtype: Literal["bfloat16", "float16", "float32"] | None = None
    progress: bool = True
    strict: bool = False
    allow_extrapolation: bool = False
    allow_in_distribution: bool = False
    tp: int = 1
    device_map: Literal["auto"] | None = None

    def __post_init__(self):
        if not self.methods or not self.tasks or not self.lengths:
            raise ValueError("a run needs at least one method, one task and one length")
        check_lengths("lengths", self.lengths)
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be at least 1, got {self.limit}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.preset is not None:
            get_preset(self.preset)
        # the method names against the installed metadata (`interface.REGISTRY`'s group), importing no method
        check_declared("method", METHODS_GROUP, [*self.methods, *self.method_options])
        for name in self.method_options:
            if name not in self.methods:
                raise ValueError(f"options given for method {name!r}, which is not in methods {self.methods}")
        for name in ("kv_cache", "dtype", "batch_size"):  # the parser and `from_yaml` check them too (Python callers)
            check_value(RunConfig, name, getattr(self, name), name)
        if self.batch_size != "auto" and self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1 or auto, got {self.batch_size}")
        if self.timed_samples < 0:
            raise ValueError(f"timed_samples must be >= 0, got {self.timed_samples}")
        if self.decode_graphs and self.kv_cache == "dynamic":
            raise ValueError("decode_graphs needs a packed KV cache (kv_cache evicting or full)")
        _check_placement_options(self)
        task_registry.expand(self.tasks)
        from elastic_bench.kernels import backend_names  # the checks above import no torch; these do

        if self.backend != "auto" and self.backend not in backend_names():
            raise did_you_mean("attention backend", self.backend, ["auto", *backend_names()])
        methods = self.build_methods()
        _check_distinct(self.methods, [self.label(m) for m in methods])
        built = dict(zip(self.methods, methods))  # -O text read by each option's type
        self.method_options = {name: {key: getattr(built[name], key) for key in values}
                               for name, values in self.method_options.items()}

    def build_methods(self) -> list[Method]:
        """The run's methods, each with the preset's options (none without a preset) and ``method_options`` over
        them."""
        from elastic_bench.modeling.interface import REGISTRY, get_method

        def options(name: str) -> dict[str, Any]:
            preset = get_preset(self.preset).options(REGISTRY.get(name).name) if self.preset else {}
            return {**preset, **self.method_options.get(name, {})}

        return [get_method(name, **options(name)) for name in self.methods]

    def label(self, method: Method) -> str:
        """The result folder of one of the run's methods (`presets.label`: the preset named where it applies)."""
        return preset_label(method, self.preset)

    @classmethod
    def from_yaml(cls, path: str | Path) -> dict[str, Any]:
        """The fields set in a YAML file, each checked against its type (one clear error per bad value)."""
        try:
            data = yaml.safe_load(Path(path).read_text())
        except OSError as err:
            raise FileNotFoundError(f"cannot read config {path}: {err.strerror}") from None
        except yaml.YAMLError as err:
            raise ValueError(f"{path} is not valid YAML: {str(err).splitlines()[0]}") from None
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a mapping of RunConfig fields, got {type(data).__name__}")
        return check_fields(cls, data, str(path))


@dataclass
class _Session:
    """What every cell of a run shares: its configuration, the model loaded once and what is derived from it."""

    config: RunConfig
    model: Any
    tokenizer: Any
    context: dict[str, Any]  # the model's context length and rope parameters (`loading.model_context`)
    stop_ids: set[int]  # the model's and tokenizer's end-of-sequence ids
    ranks: Ranks
    originals: dict[str, str]  # the run's copy of each learned file → the file it copies (`_held`), for messages
    provenance: dict[str, dict[str, Any]]  # method label → option → what its learned file was trained on (held_out)
    learned: dict[str, dict[str, str]] = field(default_factory=dict)  # result folder → `learned_names` of its method
    batch_sizes: dict[int, int] = field(default_factory=dict)  # length → the batch `auto` found (or backed off to)


@dataclass
class _CellInputs:
    """Everything one cell needs: the run's shared state, the cell's folder, its method (loading the run's copies of
    its learned files, `_held`), the fingerprint its results are known by (`_fingerprint` plus the task, its data and
    the length), its task and the task's samples at the cell's length."""

    session: _Session
    cell: Cell
    method: Method
    fingerprint: dict[str, Any]
    task: Task
    samples: list[Sample]
    calibration: dict[str, Any] | None = None  # with budgets: the split, and the calibration of the cell's method


def run(config: RunConfig, budgets: BudgetConfig | None = None) -> list[dict[str, Any]]:
    """Run every cell of ``config`` not yet complete; return one summary row per cell.

    With ``budgets`` (`elastic-bench calibrate`), every method but ``full`` is one configuration per budget, its knob
    calibrated per length on the calibration split of the samples and its cells evaluated on the held-out ones
    (`elastic_bench.evaluation.calibration`).

    The model spec is resolved once (`elastic_bench.modeling.loading.resolve_model`); the methods' learned files are
    read once, into a private folder that lives as long as the run (`_held`, `elastic_bench.results.digests.
    held_folder`). The output folder is locked for the run
    (`elastic_bench.foundation.files.exclusive`: a second writer stops with the name of the first); before the model
    loads, every cell of the run is checked: a cell of another configuration (`_fingerprint`) stops the run, a cell
    whose files cannot be trusted (`Cell.verify`) is computed again (``strict``: stops the run).
    """
    from elastic_bench.results.digests import held_folder

    with held_folder() as held:
        return _run(config, held, budgets)


def _run(config: RunConfig, held: Path, budgets: BudgetConfig | None = None) -> list[dict[str, Any]]:
    from tqdm.auto import tqdm

    from elastic_bench.foundation.files import exclusive
    from elastic_bench.kernels import torch_dtype
    from elastic_bench.modeling.generation import stop_ids
    from elastic_bench.modeling.loading import (
        check_backend,
        check_device,
        check_placement,
        load_model,
        load_tokenizer,
        model_context,
        model_digest,
        resolve_model,
    )
    from elastic_bench.tasks.corpora import identities
    from elastic_bench.training.distributed import Ranks

    built = config.build_methods()
    task_names = task_registry.expand(config.tasks)
    source = resolve_model(config.model)
    longest = max(config.lengths)
    if longest > source.positions and not config.allow_extrapolation:
        raise ValueError(f"length {longest} exceeds the {source.positions} positions {config.model} was trained for; "
                         "pass --allow-extrapolation to run it anyway")
    learned = {config.label(m): artifact_provenance(m, source.path) for m in built}
    if not config.allow_in_distribution:  # a learned file is not scored on what it was trained on
        drawn_on = {name: task_registry.REGISTRY.get(name).identities for name in task_names}
        for m in built:
            refuse_in_distribution(m, learned[config.label(m)], drawn_on)
    kept = [_held(m, source, held / str(i)) for i, m in enumerate(built)]  # (the method loading the copies, digests)
    originals = {copy: path for _, _, copies in kept for copy, path in copies.items()}
    names = {config.label(m): learned_names(m.artifacts(source.path), source) for m in built}
    model_files = model_digest(source)
    # the run's configurations by folder label: each method, or with budgets each method at each budget
    # (`calibration.entries`): (the method loading the copies, its budget, its fingerprint)
    entries: dict[str, tuple[Method, Budget | None, dict[str, Any]]] = {}
    learned_by_label = {}  # each configuration's folder label → its method's learned files' provenance
    names_by_label = {}  # and their names
    for name, m, (method, digests, _) in zip(config.methods, built, kept):
        base = _fingerprint(config, m, digests, model_files)
        for label, budget in calibration.entries(m, config.method_options.get(name, {}),
                                                 functools.partial(_label, config), budgets):
            entries[label] = (method, budget, base if budgets is None else
                              calibration.fingerprint(base, m, budget, budgets.calibration_samples))
            learned_by_label[label] = learned[config.label(m)]
            names_by_label[label] = names[config.label(m)]
    data = {name: identities(task_registry.get(name, data_dir=config.data_dir).sources, config.data_dir)
            for name in task_names}

    def fingerprint(label: str, task_name: str, length: int) -> dict[str, Any]:
        return {**entries[label][2], "task": task_name, "data": data[task_name], "length": length}

    def cell_of(label: str, task_name: str, length: int) -> Cell:
        return Cell(config.output, source.label, label, task_name, length)

    ranks = Ranks.from_env(config.device, config.tp)
    check_placement(source, config.tp, config.device_map, ranks.world_size)
    if config.decode_graphs and check_device(ranks.device(config.device)).type != "cuda":
        raise ValueError("decode_graphs needs a CUDA device")
    check_backend(config.backend, ranks.device(config.device))
    # every task fits the shortest length (with the model's tokenizer), before the weights load
    task_registry.check_length(task_names, load_tokenizer(source), min(config.lengths), config.data_dir, config.seed)
    command = "elastic-bench " + " ".join(sys.argv[1:])
    with exclusive(config.output, command, enabled=ranks.is_main):
        if ranks.is_main:  # before any work: an output folder never mixes two configurations
            for task_name in task_names:
                for length in config.lengths:
                    for label in entries:
                        _check_cell(cell_of(label, task_name, length), fingerprint(label, task_name, length),
                                    config.strict, config.data_dir)
        ranks.barrier()
        model, tokenizer = load_model(source, dtype=torch_dtype(config.dtype), device=ranks.device(config.device),
                                      tp=config.tp, device_map=config.device_map)
        provenance = {label: {name: found for name, (_, found) in files.items()}
                      for label, files in learned_by_label.items()}
        session = _Session(config, model, tokenizer, model_context(model.config), stop_ids(model, tokenizer),
                           ranks, originals, provenance, names_by_label)
        split = _Split(session, task_names, budgets)
        rows = []
        overall = tqdm(total=len(task_names) * len(config.lengths) * len(entries), unit="cell", position=0,
                       disable=not (config.progress and ranks.is_main), file=sys.stderr)
        for task_name in task_names:
            task = task_registry.get(task_name, data_dir=config.data_dir)
            for length in config.lengths:
                cells = [cell_of(label, task_name, length) for label in entries]
                todo = [(label, c) for label, c in zip(entries, cells) if not c.is_complete()]
                samples, error = [], None
                if todo:
                    try:
                        samples = split.evaluated(task_name, length)
                    except (ValueError, FileNotFoundError, KeyError) as err:
                        error = f"{task_name} at {length} tokens: {err}"
                    if not error and not samples:
                        error = f"{task_name} at {length} tokens: no samples (an empty corpus?)"
                overall.update(len(cells) - len(todo))
                for label, cell in todo:
                    overall.set_description(cell_description(overall.n, overall.total, cell))
                    inputs = _CellInputs(session, cell, entries[label][0], fingerprint(label, task_name, length),
                                         task, samples)
                    failure = error
                    if not failure and budgets is not None:
                        try:
                            inputs, failure = split.calibrated(inputs, label, entries[label][1])
                        except Exception as err:  # noqa: BLE001  (a failed calibration fails its cell, as a cell)
                            failure = f"calibration: {type(err).__name__}: {err}"
                    if not failure:
                        _run_cell(inputs)
                    elif ranks.is_main:
                        _fail(inputs, failure)
                    overall.update()
                rows.extend(summary_row(cell) for cell in cells)
        overall.set_description("cells")
        overall.close()
    return rows


def _label(config: RunConfig, method: Method, budget: Budget | None) -> str:
    """The result folder of one of the run's methods (`RunConfig.label`), at ``budget`` where it has one
    (`calibration.label`, the preset named after the budget where it applies)."""
    if budget is None:
        return config.label(method)
    preset = config.preset if applies(config.preset, method.name) else None
    return calibration.label(method, budget, get_preset(preset).options(method.name) if preset else {},
                             f"preset={preset}" if preset else None)


class _Split:
    """The samples of a run's cells (`evaluated`) and, with budgets, the calibration of each configuration and length
    (`calibrated`): per task and length, the first ``calibration_samples`` samples calibrate and the next ``limit``
    are evaluated; without budgets every sample is evaluated."""

    def __init__(self, session: _Session, task_names: list[str], budgets: BudgetConfig | None):
        self.session, self.task_names, self.budgets = session, task_names, budgets
        self._prompts: dict[tuple[str, int], list[Sample]] = {}  # (task, length) → its calibration samples
        self._found: dict[tuple[str, int], Calibration] = {}  # (label, length) → what calibrating it found

    def _samples(self, task_name: str, length: int) -> list[Sample]:
        config, extra = self.session.config, self.budgets.calibration_samples if self.budgets else 0
        limit = None if config.limit is None else config.limit + extra
        task = task_registry.get(task_name, data_dir=config.data_dir)
        samples = task.samples(self.session.tokenizer, length, limit, config.seed)
        if extra:
            if len(samples) <= extra:
                raise ValueError(f"{len(samples)} samples, none left to evaluate after the {extra} that calibrate")
            self._prompts.setdefault((task_name, length), samples[:extra])
        return samples

    def evaluated(self, task_name: str, length: int) -> list[Sample]:
        """The samples a cell of ``task_name`` at ``length`` evaluates."""
        return self._samples(task_name, length)[self.budgets.calibration_samples if self.budgets else 0:]

    def calibrated(self, inputs: _CellInputs, label: str, budget: Budget | None) -> tuple[_CellInputs, str | None]:
        """The cell's inputs with its method at the knob values calibrated for ``budget`` at the cell's length (the
        reference's as they are) and the calibration record, and why no value meets the budget (None: one does)."""
        length = inputs.cell.length
        prompts = {}
        for task_name in self.task_names:  # every task's calibration samples at the length, pooled
            if (task_name, length) not in self._prompts:
                self._samples(task_name, length)
            prompts[task_name] = self._prompts[(task_name, length)]
        ids = {task_name: [s.id for s in samples] for task_name, samples in prompts.items()}
        if budget is None:
            return dataclasses.replace(inputs, calibration=calibration.split_record(ids)), None
        if (label, length) not in self._found:
            self._found[(label, length)] = self._calibrate(inputs.method, label, length, budget, prompts)
        found = self._found[(label, length)]
        method = inputs.method if found.error else dataclasses.replace(inputs.method, **found.options)
        return dataclasses.replace(inputs, method=method, calibration=found.record(ids)), found.error

    def _calibrate(self, method: Method, label: str, length: int, budget: Budget, prompts: dict[str, list[Sample]]
                   ) -> Calibration:
        from tqdm.auto import tqdm

        session = self.session
        shown = session.config.progress and session.ranks.is_main
        with tqdm(desc=f"calibrating {label} · {length}", unit="setting", position=1, leave=False,
                  disable=not shown, file=sys.stderr) as bar:
            found = calibration.calibrate(session.model, method, budget,
                                          [s.input_ids for samples in prompts.values() for s in samples],
                                          session.config.backend,
                                          lambda value: (bar.update(), bar.set_postfix_str(f"{budget.measure} "
                                                                                           f"{value:.4f}")))
        if session.ranks.is_main:
            print(f"elastic-bench: {calibration.describe(found, label, length)}", file=sys.stderr)
        return found


def cell_description(done: int, total: int, cell: Cell) -> str:
    """The overall progress bar's description while ``cell`` runs, ``done`` of ``total`` cells finished or skipped:
    e.g. ``cell 41 of 72 (streaming · testbed · 2048)``."""
    return f"cell {done + 1} of {total} ({cell.method} · {cell.task} · {cell.length})"


def _held(method: Method, source: ModelSource, folder: Path) -> tuple[Method, dict[str, str], dict[str, str]]:
    """``method`` loading what it loads of the learned files it names (`Method.artifacts`, by option name) from the
    private ``folder`` (`Method.hold`), the SHA-256 of each by option name (`elastic_bench.foundation.files.digest`)
    and each copy's original (by path, for messages): the bytes a cell is known by are the bytes its method loads,
    whatever happens to the original files during the run. What cannot fit the model is refused here
    (`Method.check_model`)."""
    from elastic_bench.foundation.files import digest

    paths = method.artifacts(source.path)
    copies = {name: method.hold(name, Path(path), folder / name) for name, path in paths.items()}
    running = dataclasses.replace(method, **{name: str(copy) for name, copy in copies.items()})
    originals = {str(copy): str(paths[name]) for name, copy in copies.items()}
    try:
        running.check_model(source.config)  # before the weights load
    except ValueError as err:
        for copy, original in originals.items():  # name the user's file, not the run's copy of it
            err = ValueError(str(err).replace(copy, original))
        raise err from None
    return running, {name: digest(copy) for name, copy in copies.items()}, originals


def learned_names(paths: dict[str, Path], source: ModelSource) -> dict[str, str]:
    """How a report names each learned file of ``paths`` (`Method.artifacts`, by option name): one the model ships as
    ``<model>/<its path in the model folder>`` (``testbed/duo_gates``), any other by its last path component; recorded
    in each cell as ``learned_files``, so that a label says which file a method left at ``auto`` loaded."""
    model_dir = Path(source.path).resolve() if source.path else None
    names = {}
    for option, path in paths.items():
        path = Path(path).resolve()
        inside = model_dir is not None and path.is_relative_to(model_dir)
        names[option] = f"{source.label}/{path.relative_to(model_dir).as_posix()}" if inside else path.name
    return names


def _fingerprint(config: RunConfig, method: Method, artifacts: dict[str, str], model_files: str | None
                 ) -> dict[str, Any]:
    """What a cell's results depend on beyond its task, its data and its length (which `run` adds: ``task``, ``data``
    as `elastic_bench.tasks.corpora.identities`, ``length``), JSON-normalised as stored in ``config.json`` and
    ``metrics.json``: the model spec and ``model_files``, what its files hold (`elastic_bench.modeling.loading.
    model_digest`: two folders at the same path are two models); the method and its options, with the SHA-256
    ``artifacts`` of the files the method loads in place of the options that name them (`_held`: a router or gate file
    is known by what it holds, not by its path); seed, limit, dtype; the KV cache and decode graphs, which change what
    decoding computes; the preset where it sets the method's options (a method it leaves has the fingerprint of a run
    without one). Not the batch size: a batch's predictions, scores, sparsity and KV bytes are those of batch 1, and
    each prediction records its own batch; nor the kernel backend, which each prediction records."""
    options = {k: v for k, v in method.options().items() if k not in artifacts}  # those are known by their digest
    return json.loads(json.dumps({"model": config.model, "model_files": model_files, "method": method.name,
                                  "method_options": options, "artifacts": artifacts, "seed": config.seed,
                                  "limit": config.limit, "dtype": config.dtype, "kv_cache": config.kv_cache,
                                  "decode_graphs": config.decode_graphs,
                                  **({"preset": config.preset} if applies(config.preset, method.name) else {})},
                                 default=str))


def _check_cell(cell: Cell, fingerprint: dict[str, Any], strict: bool, data_dir: str | None) -> None:
    """Refuse a cell reached through a symbolic link, or of another configuration (another seed, ``--limit``, router
    contents, an empty or malformed recorded fingerprint, ...): its predictions would be mixed with, or taken for,
    this run's. Remove the temporary files of killed writes; compute a cell again whose files do not prove themselves
    (every prediction's score is computed again with its task's scorer, and a complete cell's scores with its task's
    aggregation)."""
    cell.check_links()
    changed = cell.conflict(fingerprint)
    if changed:
        raise ValueError(f"{cell.dir} holds results of another configuration ({', '.join(changed)} differ); "
                         "use another --output or delete that folder")
    cell.remove_temporaries()
    _distrust(cell, cell.verify(task_registry.get(cell.task, data_dir=data_dir)), strict)


def _distrust(cell: Cell, reason: str | None, strict: bool) -> None:
    """A cell whose files do not prove themselves for ``reason`` (None: they do) is computed again, or with ``strict``
    refused in one line."""
    if reason is None:
        return
    if strict:
        raise ValueError(f"{cell.dir}: {reason} (--strict: delete the cell or run without --strict to compute it "
                         "again)")
    print(f"elastic-bench: cell {cell.dir}: {reason}; computing it again", file=sys.stderr)
    cell.clear()


def _check_distinct(names: list[str], folders: list[str]) -> None:
    """Refuse methods ``names`` of which two have the same result folder ``folders`` (the same name twice, or two
    names of one method, ``full,dense``, with the same options): the run would count one configuration twice."""
    for i, folder in enumerate(folders):
        if folder in folders[:i]:
            first = names[folders.index(folder)]
            also = "given twice" if first == names[i] else f"and {names[i]!r} name the same method"
            raise ValueError(f"methods: {first!r} {also}, with the same options (result folder {folder}); give it "
                             "once")


def _check_placement_options(config: RunConfig) -> None:
    """Refuse ``tp`` and ``device_map`` where they cannot work with the run's other options (the model's heads and
    torchrun's processes are checked before the weights load, `elastic_bench.modeling.loading.check_placement`)."""
    if config.tp < 1:
        raise ValueError(f"tp must be at least 1, got {config.tp}")
    if config.tp > 1 and config.batch_size == "auto":
        raise ValueError("batch_size auto probes memory on one rank; give a number with --tp")
    if config.tp > 1 and config.decode_graphs:
        raise ValueError("decode_graphs are not supported with --tp")
    if config.device_map is not None and config.device is not None:
        raise ValueError("give --device or --device-map, not both")


def _cell_config(inputs: _CellInputs, n: int) -> dict[str, Any]:
    """What a cell's config.json and metrics.json record of its configuration, with ``n`` samples; the model's context
    length and rope parameters, what its learned files were trained on (`held_out`: ``artifact_provenance``,
    ``in_distribution``, ``allow_in_distribution``), and its layer kinds with the layers the method plans
    (``routed_layers``), are recorded beside the fingerprint, not in it: they change no prediction (a router's
    provenance is in its file, which the fingerprint knows by its digest)."""
    from elastic_bench.modeling.layer_kinds import layer_kinds, layers_by_kind
    from elastic_bench.results.provenance import provenance

    config, fingerprint = inputs.session.config, inputs.fingerprint
    learned = inputs.session.provenance[inputs.cell.method]
    kinds = layers_by_kind(layer_kinds(inputs.session.model.config))
    return {
        **{k: fingerprint[k] for k in ("model", "method_options", "seed", "limit", "dtype")},
        "preset": fingerprint.get("preset"),
        "method": inputs.method.name,
        "task": inputs.cell.task,
        "length": inputs.cell.length,
        "num_samples": n,
        "backend": config.backend,
        "kv_cache": config.kv_cache,
        "decode_graphs": config.decode_graphs,
        "batch_size": config.batch_size,
        "timed_samples": config.timed_samples,
        "allow_extrapolation": config.allow_extrapolation,
        "artifact_provenance": learned,
        "in_distribution": in_distribution(learned, inputs.task.identities),
        "allow_in_distribution": config.allow_in_distribution,
        "model_context": inputs.session.context,
        "learned_files": inputs.session.learned.get(inputs.cell.method, {}),
        "layer_kinds": kinds,
        "routed_layers": sorted(kinds.get("full", []) + kinds.get("mla", [])),
        "fingerprint": fingerprint,
        **({"calibration": inputs.calibration} if inputs.calibration is not None else {}),
        **provenance(config.device),
    }


def _run_cell(inputs: _CellInputs) -> None:
    import torch
    from tqdm.auto import tqdm

    from elastic_bench.modeling import generation
    from elastic_bench.modeling.attention import apply

    session, cell, method, samples = inputs.session, inputs.cell, inputs.method, inputs.samples
    config, ranks = session.config, session.ranks
    if ranks.is_main:
        _distrust(cell, cell.kept_problem(_expected(samples)), config.strict)
        cell.start(_cell_config(inputs, len(samples)))
    ranks.barrier()
    done = {r["id"] for r in cell.predictions()}
    mine = [s for s in samples if s.id not in done][ranks.replica :: ranks.replicas]  # the ranks of a replica alike
    shard = ranks.replica if ranks.replicas > 1 else None
    desc = f"{cell.method} · {cell.task} · {cell.length}"
    error = None
    try:
        # the decode graphs of the cell: rows with room for its longest prompt and answer, follow-up turns aside
        graphs = generation.DecodeGraphs(max(len(s.input_ids) for s in samples) + max(s.max_new_tokens for s in samples)
                                         ) if config.decode_graphs else False
        if mine:  # compile the method's kernels (and capture a batch of one's graph) before the first timed prefill
            with apply(method, session.model, backend=config.backend, kv_cache=config.kv_cache):
                generation.warm_up(session.model, mine[0].input_ids, graphs)
        with apply(method, session.model, backend=config.backend, kv_cache=config.kv_cache,
                   time_parts=True) as handle, \
                tqdm(total=len(mine), desc=desc, disable=not (config.progress and ranks.is_main), leave=False,
                     position=1, file=sys.stderr) as bar:
            for record in _generate(inputs, mine, handle, graphs):
                if ranks.writes:
                    cell.append(record, shard)
                bar.update()
    except StorageError:  # a full disk or a read-only folder: the user's to fix, for every cell alike
        raise
    except torch.cuda.OutOfMemoryError:
        error = f"out of memory at {cell.length} tokens (rank {ranks.rank})"
        torch.cuda.empty_cache()
    except Exception as err:  # noqa: BLE001  (a failed cell must not stop the run)
        error = f"{type(err).__name__}: {err}"
    errors = [e for e in ranks.gather(error) if e]
    # rank 0's method statistics of a cell that ran, which a tensor-parallel method sums over its replica's ranks (a
    # collective there)
    extra = method.extra_stats() if ranks.replica == 0 and not errors else {}
    if ranks.is_main:
        records = cell.merge([s.id for s in samples])
        scores = inputs.task.aggregate(records) if records and not errors else {}
        if not errors and not records:
            errors = ["no predictions"]
        if not errors and not math.isfinite(scores.get("score", math.nan)):
            errors = [f"the score is not a number ({scores.get('score')})"]
        if errors:
            _fail(inputs, "; ".join(errors))
        else:
            cell.finish(
                {
                    **_cell_config(inputs, len(records)),
                    "status": "complete",
                    "method_label": cell.method,
                    "method_resolved": method.resolved_options(),  # known once its files load, after config.json
                    **backends_used(records),
                    "world_size": ranks.world_size,
                    "tp": ranks.tp,
                    **scores,
                    **{key: _mean(records, key) for key in MEANS},
                    **timing(records),
                    **extra,
                }
            )
    ranks.barrier()


def _expected(samples: list[Sample]) -> dict[str, dict[str, Any]]:
    """What a kept prediction of each sample holds as its sample gives it (`Cell.kept_problem`), as JSON values."""
    return json.loads(json.dumps({s.id: {"references": s.references, "metadata": s.metadata,
                                         "input_tokens": len(s.input_ids)} for s in samples}, default=str))


def _generate(inputs: _CellInputs, mine: list[Sample], handle, graphs) -> Iterator[dict[str, Any]]:
    """The prediction records of the cell's samples ``mine``. At batch size 1, each alone. Batched: the first
    ``timed_samples`` prompts of the cell are prefilled with nothing else pending and timed; with decode graphs they
    are the first rows of the first batch (each prompt of a batch is prefilled alone there), without them they run
    alone (batch 1) before the others. The batches are of even size, at most the batch size (a batch that runs out of
    memory is retried at half the size, which the length then keeps); with graphs every batch decodes in one shape,
    whose graph is captured before any batch's time is counted, and a smaller last batch leaves rows empty."""
    import torch

    from elastic_bench.modeling import generation

    config, length = inputs.session.config, inputs.cell.length
    if config.batch_size == 1:
        for sample in mine:
            yield _predict(inputs, sample, handle, graphs)[0]
        return
    timed = {s.id for s in inputs.samples[: config.timed_samples]}
    pending = list(mine)
    if not graphs:
        for sample in [s for s in mine if s.id in timed]:
            yield _predict(inputs, sample, handle, graphs)[0]
        pending = [s for s in mine if s.id not in timed]
    size = even(len(pending), _batch_size(inputs, pending, graphs)) if pending else 1
    warm = 1  # the batch shape whose graph is captured
    while pending:
        if graphs and size != warm:  # before any batch of the shape is timed
            generation.warm_up(inputs.session.model, pending[0].input_ids[:WARM_TOKENS], graphs, rows=size)
            warm = size
        batch = pending[:size]
        try:
            records = [_predict(inputs, batch[0], handle, graphs)[0]] if size == 1 else \
                _predict_batch(inputs, batch, handle, graphs, timed, size)
        except torch.cuda.OutOfMemoryError:
            if size == 1:
                raise
            records = None
        if records is None:  # out of the except block, which held the failed batch's tensors
            if graphs:
                graphs.drop(size)
            torch.cuda.empty_cache()
            inputs.session.batch_sizes[length] = size // 2
            size = even(len(pending), size // 2)
            continue
        yield from records
        pending = pending[size:]


def even(prompts: int, most: int) -> int:
    """The size of the fewest batches of at most ``most`` prompts that hold ``prompts``, as even as they can be (the
    last one at most one batch-count smaller)."""
    return math.ceil(prompts / math.ceil(prompts / most))


def _batch_size(inputs: _CellInputs, pending: list[Sample], graphs) -> int:
    """The batch of the cell's untimed prompts: ``batch_size``, or for ``auto`` the one found for the cell's length
    (the first cell at a length probes with its longest prompt on CUDA; `CPU_AUTO_BATCH` on the CPU)."""
    from elastic_bench.modeling import generation

    session, length = inputs.session, inputs.cell.length
    if session.config.batch_size != "auto":
        return session.config.batch_size
    if length not in session.batch_sizes:
        if next(session.model.parameters()).device.type != "cuda":
            session.batch_sizes[length] = CPU_AUTO_BATCH
        else:
            longest = max(pending, key=lambda s: len(s.input_ids))
            session.batch_sizes[length] = generation.fitting_batch(  # with graphs, static caches count
                session.model, longest.input_ids, min(MAX_AUTO_BATCH, len(inputs.samples)), graphs)
    return session.batch_sizes[length]


def _predict(inputs: _CellInputs, sample: Sample, handle, graphs, earlier: tuple[str, ...] = ()
             ) -> tuple[dict[str, Any], float]:
    """Generate for one sample alone (and the task's follow-up turns, e.g. chain of thought) under ``handle`` (the
    cell's `apply`); its prediction record (the last turn's timing, sparsity and cache) and the seconds of all its
    turns. ``earlier``: predictions of turns already generated."""
    from elastic_bench.modeling.generation import greedy_generate

    session, task = inputs.session, inputs.task
    earlier = list(earlier)
    seconds = 0.0
    while True:
        handle.reset()
        stops = session.stop_ids | set(sample.stop_token_ids)
        gen = greedy_generate(session.model, sample.input_ids, sample.max_new_tokens, stops, sample.min_new_tokens,
                              decode_graphs=graphs)
        seconds += gen.prefill_seconds + gen.decode_seconds
        prediction = session.tokenizer.decode(gen.tokens, skip_special_tokens=True)
        follow_up = task.follow_up(sample, prediction, session.tokenizer)
        if follow_up is None:
            break
        earlier.append(prediction)
        sample = follow_up
    parts = handle.prefill_parts()  # the last turn's prefill, taken apart
    timed = {
        "prefill_seconds": gen.prefill_seconds,
        **({"prefill_parts": parts[-1]} if parts else {}),
        "decode_seconds": gen.decode_seconds,
        "decode_ms_per_token": 1000 * gen.decode_seconds / gen.decode_steps if gen.decode_steps else None,
        "batch_size": 1,
    }
    stats = handle.stats()
    record = _record(inputs, sample, prediction, earlier, len(gen.tokens), timed, (gen.kv_bytes, gen.kv_bytes_full),
                     stats["per_sample"][0], stats, handle.decisions()[0])
    return record, seconds


def _predict_batch(inputs: _CellInputs, samples: list[Sample], handle, graphs, timed: set[str], shape: int
                   ) -> list[dict[str, Any]]:
    """Generate for ``samples`` as one batch under ``handle`` (with ``graphs``: in a batch of ``shape`` rows, the
    prompts ``timed`` prefilled and timed alone); their prediction records, in order. A sample's follow-up turns run
    alone after the batch (`_predict`)."""
    from elastic_bench.modeling import generation

    session, task = inputs.session, inputs.task
    handle.reset()
    batch = generation.generate(
        session.model, [s.input_ids for s in samples], [s.max_new_tokens for s in samples],
        [session.stop_ids | set(s.stop_token_ids) for s in samples], [s.min_new_tokens for s in samples],
        decode_graphs=graphs, pad_id=session.tokenizer.pad_token_id or 0,
        **({"timed": [s.id in timed for s in samples], "rows": shape} if graphs else {}))
    stats, decisions, parts = handle.stats(), handle.decisions(), handle.prefill_parts()
    share = (batch.prefill_seconds + batch.decode_seconds) / len(samples)
    per_token = 1000 * batch.decode_seconds / batch.decode_steps if batch.decode_steps else None
    records = []
    for i, (sample, row) in enumerate(zip(samples, batch.rows)):
        alone = row.prefill_seconds is not None and len(parts) == len(samples)  # graphs: one prefill per prompt
        timed = {
            "prefill_seconds": row.prefill_seconds,  # a prompt's own only where it was timed alone
            **({"prefill_parts": parts[i]} if alone else {}),
            "decode_seconds": None,
            "decode_ms_per_token": per_token,
            "batch_size": len(samples),
        }
        prediction = session.tokenizer.decode(row.tokens, skip_special_tokens=True)
        follow_up = task.follow_up(sample, prediction, session.tokenizer)
        if follow_up is None:
            record = _record(inputs, sample, prediction, [], len(row.tokens), timed, (row.kv_bytes, row.kv_bytes_full),
                             stats["per_sample"][i], stats, decisions[i])
            seconds = 0.0
        else:
            record, seconds = _predict(inputs, follow_up, handle, graphs, earlier=(prediction,))
            record.update(timed)
        records.append({**record, "generation_seconds": share + seconds})
    return records


def _record(inputs: _CellInputs, sample: Sample, prediction: str, earlier: list[str], output_tokens: int,
            timed: dict[str, Any], kv_bytes: tuple[int | None, int | None], sparsity: dict[str, float],
            stats: dict[str, Any], decisions) -> dict[str, Any]:
    """One sample's prediction record: its last turn's ``prediction`` and score, ``timed`` (prefill and decode
    seconds, the batch), the KV bytes its packed cache kept beside a full cache's (`PackedCache.sample_nbytes`;
    none for another cache), its ``sparsity`` (`MethodHandle.stats` per sample), the kernel backend of the prefill
    and its per-layer ``decisions`` ``[L, H]``."""
    from elastic_bench.modeling.tensor_parallel import tensor_parallel

    shard = tensor_parallel(inputs.session.model)
    held, full = shard.sum(kv_bytes) if shard else kv_bytes  # a tensor-parallel rank holds its heads' rows
    return {
        "id": sample.id,
        "prediction": prediction,
        **({"earlier_turns": earlier} if earlier else {}),
        "references": sample.references,
        "score": inputs.task.score(prediction, sample),
        "metadata": sample.metadata,
        "input_tokens": len(sample.input_ids),
        "output_tokens": output_tokens,
        **timed,
        **({"kv_bytes": held, "kv_bytes_full": full} if held is not None else {}),
        **sparsity,
        "backend": "+".join(sorted(stats["prefill_backends"])),
        "decisions": decisions.tolist(),
    }


def timing(records: list[dict[str, Any]]) -> dict[str, Any]:
    """A cell's timing from its prediction records: ``prefill_seconds_median`` and ``prefill_samples`` over the
    prompts timed alone; ``batch_size_used`` (the largest batch); ``decode_ms_per_token`` over the batched prompts
    (all prompts when none is); where prompts ran batched, ``samples_per_second``: the batched prompts over the
    seconds their batches took (prefill and decode, follow-up turns included); and where prefills were taken apart,
    ``prefill_parts`` (the mean seconds of each part over them) and ``prefill_unexplained`` (their mean prefill less
    the parts' sum)."""
    prefills = [r["prefill_seconds"] for r in records if r.get("prefill_seconds") is not None]
    batched = [r for r in records if r.get("batch_size", 1) > 1]
    found = {
        "prefill_seconds_median": statistics.median(prefills) if prefills else math.nan,
        "prefill_samples": len(prefills),
        "batch_size_used": max((r.get("batch_size", 1) for r in records), default=1),
        "decode_ms_per_token": _mean(batched or records, "decode_ms_per_token"),
    }
    if batched:
        found["samples_per_second"] = len(batched) / sum(r["generation_seconds"] for r in batched)
    parted = [r for r in records if r.get("prefill_parts") and r.get("prefill_seconds") is not None]
    if parted:
        from elastic_bench.kernels.timing import unexplained

        parts = {name: statistics.mean(r["prefill_parts"][name] for r in parted) for name in parted[0]["prefill_parts"]}
        found["prefill_parts"] = parts
        found["prefill_unexplained"] = unexplained(statistics.mean(r["prefill_seconds"] for r in parted), parts)
    return found


def backends_used(records: list[dict[str, Any]]) -> dict[str, Any]:
    """``backend_used``: the kernel backend that ran the cell's prefills (the most frequent one, where they differ),
    and ``backend_counts`` (backend → predictions) where they differ."""
    counts = Counter(r["backend"] for r in records)
    if not counts:
        return {"backend_used": None}
    used = {"backend_used": counts.most_common(1)[0][0]}
    return used | ({"backend_counts": dict(counts)} if len(counts) > 1 else {})


def _mean(records: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in records if r.get(key) is not None]
    return sum(values) / len(values) if values else float("nan")


def _fail(inputs: _CellInputs, error: str) -> None:
    cell = inputs.cell
    for copy, original in inputs.session.originals.items():  # name the user's file, not the run's copy of it
        error = error.replace(copy, original)
    print(f"elastic-bench: cell {cell.dir} failed: {error}", file=sys.stderr)
    cell.dir.mkdir(parents=True, exist_ok=True)
    done = len(cell.predictions())
    cell.finish({"status": "failed", "error": error, "num_samples_done": done, **_cell_config(inputs, done)})
