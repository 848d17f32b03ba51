"""The evaluation runner: cells = model × method × task × length, each written to the results store.

Design decisions:
- Config layering: `RunConfig` defaults → YAML file → command-line flags, each value type-checked, the whole validated
  in ``__post_init__`` (unknown methods, method options, tasks and backends fail before the model loads).
- Samples of a (task, length) are generated once and shared by every method, so methods see identical prompts.
- One prompt at a time (batch 1, the paper's setting), greedy, with the prefill timed on its own.
- Under ``torchrun`` every rank (one GPU each) takes every W-th remaining sample of a cell; rank 0 merges the
  predictions and writes the metrics.
- A cell that fails (out of memory, a malformed record, a missing corpus) is recorded as failed with its error; the
  run goes on. Complete cells are skipped; interrupted cells resume from their last written prediction.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from elastic_bench import tasks as task_registry
from elastic_bench.foundation.options import check_fields, check_value
from elastic_bench.foundation.registry import did_you_mean
from elastic_bench.kernels import backend_names
from elastic_bench.modeling.interface import Method, get_method
from elastic_bench.results.store import Cell

# Per-sample values averaged into a cell's metrics.
MEANS = ("omega_msr", "omega_esr", "omega_esr_last_row", "prefill_seconds", "decode_ms_per_token", "kv_bytes",
         "kv_bytes_full")


@dataclass
class RunConfig:
    """What to evaluate (the options of ``elastic-bench run``; a ``--config`` YAML file holds the same fields).

    Attributes:
        model: tiny:qwen3, tiny:llama, testbed, random:llama-3.1-8b, random:qwen3-8b, a local model folder, a GGUF
            file (or a folder holding one) or a hub id.
        methods: comma-separated method names (see `elastic-bench methods`).
        method_options: per-method knobs, ``{"streaming": {"local": 256}}`` (on the command line: ``-O
            streaming.local=256``).
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
        decode_graphs: decode with the model's small operations compiled, the steps after two eager ones replayed as one
            CUDA graph (CUDA and a packed cache).
        device: cuda, cpu, cuda:1, ... (none: cuda when available).
        dtype: model weights dtype (none: bfloat16 on CUDA, float32 on the CPU).
        progress: show progress bars.
        strict: stop when a cell's files do not prove themselves (a torn or edited predictions.jsonl, a config.json
            missing under predictions) instead of computing the cell again.
        allow_extrapolation: run lengths beyond the positions the model was trained for (its
            max_position_embeddings); recorded in each cell.
    """

    model: str = "tiny:qwen3"
    methods: list[str] = field(default_factory=lambda: ["full", "streaming"])
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks: list[str] = field(default_factory=lambda: ["ruler_niah_single_1"])
    lengths: list[int] = field(default_factory=lambda: [1024, 2048])
    limit: int | None = None
    seed: int = 42
    output: str = "runs/latest"
    data_dir: str | None = None
    backend: str = "auto"
    kv_cache: Literal["evicting", "full", "dynamic"] = "evicting"
    decode_graphs: bool = False
    device: str | None = None
    dtype: Literal["bfloat16", "float16", "float32"] | None = None
    progress: bool = True
    strict: bool = False
    allow_extrapolation: bool = False

    def __post_init__(self):
        if not self.methods or not self.tasks or not self.lengths:
            raise ValueError("a run needs at least one method, one task and one length")
        if any(length <= 0 for length in self.lengths):
            raise ValueError(f"lengths must be positive token counts, got {self.lengths}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be at least 1, got {self.limit}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        for name in self.method_options:
            if name not in self.methods:
                raise ValueError(f"options given for method {name!r}, which is not in methods {self.methods}")
        if self.dtype not in (None, "bfloat16", "float16", "float32"):
            raise ValueError(f"dtype must be bfloat16, float16 or float32, got {self.dtype!r}")
        check_value(RunConfig, "kv_cache", self.kv_cache, "kv_cache")
        if self.decode_graphs and self.kv_cache == "dynamic":
            raise ValueError("decode_graphs needs a packed KV cache (kv_cache evicting or full)")
        if self.backend != "auto" and self.backend not in backend_names():
            raise did_you_mean("attention backend", self.backend, ["auto", *backend_names()])
        self.build_methods()
        task_registry.expand(self.tasks)

    def build_methods(self) -> list[Method]:
        return [get_method(name, **self.method_options.get(name, {})) for name in self.methods]

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


def run(config: RunConfig) -> list[dict[str, Any]]:
    """Run every cell of ``config`` not yet complete; return one summary row per cell.

    The output folder is locked for the run (`elastic_bench.foundation.files.exclusive`: a second writer stops with the
    name of
    the first); before the model loads, every cell of the run is checked: a cell of another configuration stops the
    run, a cell whose files cannot be trusted (`Cell.verify`) is computed again (``strict``: stops the run).
    """
    import torch

    from elastic_bench.foundation.files import exclusive
    from elastic_bench.modeling.loading import load_model, max_positions, model_context, model_dir, model_label
    from elastic_bench.training.distributed import Ranks

    built = config.build_methods()
    task_names = task_registry.expand(config.tasks)
    longest = max(config.lengths)
    positions = max_positions(config.model)
    if longest > positions and not config.allow_extrapolation:
        raise ValueError(f"length {longest} exceeds the {positions} positions {config.model} was trained for; "
                         "pass --allow-extrapolation to run it anyway")
    source = model_dir(config.model)
    fingerprints = {m.label(): _fingerprint(config, m, source) for m in built}

    def cell_of(method: Method, task_name: str, length: int) -> Cell:
        return Cell(config.output, model_label(config.model), method.label(), task_name, length)

    ranks = Ranks.from_env(config.device)
    if config.decode_graphs:
        from elastic_bench.modeling.loading import check_device

        if check_device(ranks.device(config.device)).type != "cuda":
            raise ValueError("decode_graphs needs a CUDA device")
    command = "elastic-bench " + " ".join(sys.argv[1:])
    with exclusive(config.output, command, enabled=ranks.is_main):
        if ranks.is_main:  # before any work: an output folder never mixes two configurations
            for task_name in task_names:
                for length in config.lengths:
                    for m in built:
                        _check_cell(cell_of(m, task_name, length), {**fingerprints[m.label()], "length": length},
                                    config.strict)
        ranks.barrier()
        dtype = getattr(torch, config.dtype) if config.dtype else None
        model, tokenizer = load_model(config.model, dtype=dtype, device=ranks.device(config.device))
        context = model_context(model.config)
        stop_ids = _stop_ids(model, tokenizer)
        rows = []
        for task_name in task_names:
            task = task_registry.get(task_name, data_dir=config.data_dir)
            for length in config.lengths:
                cells = [cell_of(m, task_name, length) for m in built]
                todo = [(m, c) for m, c in zip(built, cells) if not c.is_complete()]
                samples, error = [], None
                if todo:
                    try:
                        samples = task.samples(tokenizer, length, config.limit, config.seed)
                    except (ValueError, FileNotFoundError, KeyError) as err:
                        error = f"{task_name} at {length} tokens: {err}"
                    if not error and not samples:
                        error = f"{task_name} at {length} tokens: no samples (an empty corpus?)"
                for method, cell in todo:
                    fingerprint = {**fingerprints[method.label()], "length": length}
                    if error:
                        if ranks.is_main:
                            _fail(cell, config, method, fingerprint, context, error)
                    else:
                        _run_cell(model, tokenizer, task, samples, method, cell, config, fingerprint, context, stop_ids,
                                  ranks)
                rows.extend(summary_row(cell) for cell in cells)
    return rows


def _stop_ids(model, tokenizer) -> set[int]:
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def _fingerprint(config: RunConfig, method: Method, source: str) -> dict[str, Any]:
    """What a cell's results depend on beyond its task (JSON-normalised, as stored in ``config.json`` and
    ``metrics.json``): the model, the method and its options, the SHA-256 of every file the method loads in place of
    the option that names it (a router or gate file is known by what it holds, not by its path), seed, limit and
    dtype."""
    from elastic_bench.foundation.files import digest

    artifacts = {name: digest(path) for name, path in method.artifacts(source).items()}
    options = {k: v for k, v in method.options().items() if k not in artifacts}  # those are known by their digest
    return json.loads(json.dumps({"model": config.model, "method": method.name, "method_options": options,
                                  "artifacts": artifacts, "seed": config.seed, "limit": config.limit,
                                  "dtype": config.dtype}, default=str))


def _check_cell(cell: Cell, fingerprint: dict[str, Any], strict: bool) -> None:
    """Refuse a cell of another configuration (another seed, ``--limit``, router contents, ...): its predictions would
    be mixed with, or taken for, this run's. Compute a cell again whose files do not prove themselves."""
    changed = cell.conflict(fingerprint)
    if changed:
        raise ValueError(f"{cell.dir} holds results of another configuration ({', '.join(changed)} differ); "
                         "use another --output or delete that folder")
    reason = cell.verify()
    if reason is None:
        return
    if strict:
        raise ValueError(f"{cell.dir}: {reason} (--strict: delete the cell or run without --strict to compute it "
                         "again)")
    print(f"elastic-bench: cell {cell.dir}: {reason}; computing it again", file=sys.stderr)
    cell.clear()


def _cell_config(config: RunConfig, method: Method, fingerprint: dict[str, Any], context: dict[str, Any], task: str,
                 length: int, n: int) -> dict[str, Any]:
    """What a cell's config.json and metrics.json record of its configuration; ``context`` is the model's context
    length and rope parameters (`elastic_bench.modeling.loading.model_context`), recorded beside the fingerprint, not
    in it."""
    from elastic_bench.results.provenance import provenance

    return {
        **{k: fingerprint[k] for k in ("model", "method_options", "seed", "limit", "dtype")},
        "method": method.name,
        "task": task,
        "length": length,
        "num_samples": n,
        "backend": config.backend,
        "kv_cache": config.kv_cache,
        "decode_graphs": config.decode_graphs,
        "allow_extrapolation": config.allow_extrapolation,
        "model_context": context,
        "fingerprint": fingerprint,
        **provenance(config.device),
    }


def _run_cell(model, tokenizer, task, samples, method, cell: Cell, config: RunConfig, fingerprint, context, stop_ids,
              ranks):
    import torch
    from tqdm.auto import tqdm

    from elastic_bench.modeling import generation
    from elastic_bench.modeling.attention import apply

    if ranks.is_main:
        cell.start(_cell_config(config, method, fingerprint, context, task.name, cell.length, len(samples)))
    ranks.barrier()
    done = {r["id"] for r in cell.predictions()}
    mine = [s for s in samples if s.id not in done][ranks.rank :: ranks.world_size]
    shard = ranks.rank if ranks.world_size > 1 else None
    desc = f"{method.label()} · {task.name} · {cell.length}"
    error = None
    try:
        if mine:  # compile the method's kernels at this length before the first timed prefill
            with apply(method, model, backend=config.backend, kv_cache=config.kv_cache):
                generation.warm_up(model, mine[0].input_ids, config.decode_graphs)
        with apply(method, model, backend=config.backend, kv_cache=config.kv_cache) as handle:
            shown = config.progress and ranks.is_main
            for sample in tqdm(mine, desc=desc, disable=not shown, leave=False, file=sys.stderr):
                cell.append(_predict(model, tokenizer, task, sample, handle, stop_ids, config.decode_graphs), shard)
    except torch.cuda.OutOfMemoryError:
        error = f"out of memory at {cell.length} tokens (rank {ranks.rank})"
        torch.cuda.empty_cache()
    except Exception as err:  # noqa: BLE001  (a failed cell must not stop the run)
        error = f"{type(err).__name__}: {err}"
    errors = [e for e in ranks.gather(error) if e]
    if ranks.is_main:
        records = cell.merge([s.id for s in samples])
        scores = task.aggregate(records) if records and not errors else {}
        if not errors and not records:
            errors = ["no predictions"]
        if not errors and not math.isfinite(scores.get("score", math.nan)):
            errors = [f"the score is not a number ({scores.get('score')})"]
        if errors:
            _fail(cell, config, method, fingerprint, context, "; ".join(errors))
        else:
            cell.finish(
                {
                    **_cell_config(config, method, fingerprint, context, task.name, cell.length, len(records)),
                    "status": "complete",
                    "method_label": method.label(),
                    **backends_used(records),
                    "world_size": ranks.world_size,
                    **scores,
                    **{key: _mean(records, key) for key in MEANS},
                    "prefill_seconds_median": statistics.median(r["prefill_seconds"] for r in records),
                    **method.extra_stats(),
                }
            )
    ranks.barrier()


def _predict(model, tokenizer, task, sample, handle, stop_ids, decode_graphs: bool = False) -> dict[str, Any]:
    """Generate for one sample (and the task's follow-up turns, e.g. chain of thought); its prediction record."""
    from elastic_bench.modeling.generation import greedy_generate

    earlier: list[str] = []  # predictions of earlier turns
    while True:
        handle.reset()
        stops = stop_ids | set(sample.stop_token_ids)
        gen = greedy_generate(model, sample.input_ids, sample.max_new_tokens, stops, sample.min_new_tokens,
                              decode_graphs=decode_graphs)
        prediction = tokenizer.decode(gen.tokens, skip_special_tokens=True)
        follow_up = task.follow_up(sample, prediction, tokenizer)
        if follow_up is None:
            break
        earlier.append(prediction)
        sample = follow_up
    stats = handle.stats()
    return {
        "id": sample.id,
        "prediction": prediction,
        **({"earlier_turns": earlier} if earlier else {}),
        "references": sample.references,
        "score": task.score(prediction, sample),
        "metadata": sample.metadata,
        "input_tokens": len(sample.input_ids),
        "output_tokens": len(gen.tokens),
        "prefill_seconds": gen.prefill_seconds,
        "decode_seconds": gen.decode_seconds,
        "decode_ms_per_token": 1000 * gen.decode_seconds / gen.decode_steps if gen.decode_steps else None,
        **{key: stats[key] for key in ("kv_bytes", "kv_bytes_full") if key in stats},
        **stats["per_sample"][0],
        "backend": "+".join(sorted(stats["prefill_backends"])),
        "decisions": handle.decisions()[0].tolist(),
    }


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


def _fail(cell: Cell, config: RunConfig, method: Method, fingerprint: dict[str, Any], context: dict[str, Any],
          error: str) -> None:
    print(f"elastic-bench: cell {cell.dir} failed: {error}", file=sys.stderr)
    cell.dir.mkdir(parents=True, exist_ok=True)
    done = len(cell.predictions())
    config_fields = _cell_config(config, method, fingerprint, context, cell.task, cell.length, done)
    cell.finish({"status": "failed", "error": error, "num_samples_done": done, **config_fields})


def summary_row(cell: Cell) -> dict[str, Any]:
    """One line of the run summary for ``cell``."""
    metrics = cell.metrics() or {}
    return {
        "model": cell.model,
        "method": cell.method,
        "task": cell.task,
        "length": cell.length,
        "status": metrics.get("status", "missing"),
        "score": metrics.get("score"),
        "omega_msr": metrics.get("omega_msr"),
        "omega_esr": metrics.get("omega_esr"),
        "prefill_ms": 1000 * metrics["prefill_seconds"] if "prefill_seconds" in metrics else None,
    }


def format_rows(rows: list[dict[str, Any]]) -> str:
    """A fixed-width text table of summary rows."""
    if not rows:
        return "(no cells)"
    columns = list(rows[0])

    def fmt(value: Any) -> str:
        if isinstance(value, float):
            return "nan" if math.isnan(value) else f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
        return "-" if value is None else str(value)

    cells = [[fmt(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)
