"""The training engine: one loop, one resumable training state and one log for every trainer in elastic-bench.

A trainer (Elastic Attention's routers in `elastic_bench.method.trainer`, the testbed model in
`elastic_bench.testbed.training.train`, gate trainers) subclasses `Objective` with what is its own (the batches, the
learning-rate schedule, the loss of each micro-batch, the log record) and calls `fit`, which owns the rest:

- Batches: ``objective.batches[s]`` is the batch of step ``s``, a pure function of the seed and ``s``; a
  `torch.utils.data.DataLoader` draws steps ``start … steps - 1`` (``sampler=range(start, steps)``, optionally in
  worker processes), so a resumed run sees the batches an uninterrupted one sees.
- A step: the learning rate of each parameter group from the schedule, ``zero_grad(set_to_none=True)``, each
  micro-batch's forward then its backward (`Objective.losses` yields one loss per micro-batch), under ``torchrun`` an
  all-reduce (sum) of the gradients of the replicated parameters (the backbone itself is sharded with FSDP2, `shard`),
  a gradient-norm clip, the optimizer step, the log record.
- Checkpoints every `RunOptions.save_every` steps, every `RunOptions.save_minutes` of training (so a run killed before
  its first step checkpoint loses minutes, not its log), at the last step and when `RunOptions.max_minutes` is up (the
  run then stops; running it again resumes). A checkpoint is the training state as plain data, no Python objects: the
  trainable modules' state dicts and the optimizer's per-parameter tensors in ``train_state.safetensors``, everything
  else (step, trained seconds, the configuration fingerprint, the optimizer's param groups and scalar state) as JSON
  in the same file's header, so one atomic rename commits a checkpoint, and in ``train_state.json`` next to it for
  reading.
- How a run executes (`RunOptions`: its folder, checkpoint interval, time limit, progress bar, data workers) is apart
  from what it learns (the trainer's configuration), so a resumed run may change it.
- Resume: the run's fingerprint (its configuration minus `RESUMABLE`, the fields that do not change what is learned)
  must equal the saved one, else one ValueError names the differing fields.
- Log: one JSON line per record in ``train_log.jsonl`` (rank 0); on resume the lines after the resumed step (written
  after the last checkpoint by an interrupted run) are cut.

It also holds the packed-row data path shared by the trainers of a frozen LLM (`tokenize`, `pack`, `LossModel`):

- The prompt is one user turn through the tokenizer's chat template (`elastic_bench.tasks.base.render`; Qwen3:
  ``enable_thinking=False``) with the generation prompt; the answer follows as the assistant turn, ended by the
  tokenizer's EOS token. Samples longer than ``max_tokens`` lose the middle of their prompt (the first and last prompt
  tokens are kept), or are kept whole for `in_range` to leave out (the official packing's rule).
- Packing: samples sorted by length (longest first) go first-fit into rows of at most ``pack_tokens`` tokens; each row
  keeps its samples' boundaries (``cu_seqlens``), restarted positions, prompt lengths and categories.
- LM-loss targets: the answer tokens only (``loss_tokens="answer"``) or every next token inside a sample (``"all"``,
  the choice of the official Elastic Attention training, ``LCM-Lab/Elastic-Attention``: only each sample's first
  token is not predicted).
- Loss: token cross-entropy summed in `LOSS_CHUNK`-token chunks, each recomputed in backward, so no ``[T, vocab]``
  logits are kept.

Part of the core: imports `elastic_bench.foundation.files`, `elastic_bench.training.distributed` and (lazily)
`elastic_bench.tasks`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Protocol

import torch
from torch import nn

from elastic_bench.foundation.files import append_jsonl, atomic_path, read_jsonl, write_json, write_jsonl
from elastic_bench.foundation.options import check_folder_output
from elastic_bench.training.distributed import Ranks

STATE_TENSORS = "train_state.safetensors"
STATE_JSON = "train_state.json"
LOG_FILE = "train_log.jsonl"
STATE_FORMAT = 1
# Fields of a trainer's configuration that do not change what is learned: the fingerprint leaves them out, so a resumed
# run may change them.
RESUMABLE = ("device", "backend", "gradient_checkpointing", "eval_samples")
LOSS_CHUNK = 2048

LossTokens = Literal["all", "answer"]


# ---- the loop ------------------------------------------------------------------------------------------------------


@dataclass
class RunOptions:
    """How a training run executes: what the ``train-*`` commands run with and what a trainer passes to `fit`. None of
    it changes what is learned (it is no part of a trainer's configuration nor of its fingerprint), so a resumed run
    may change any of it.

    Attributes:
        output: folder of the training state (``train_state.safetensors``, ``train_state.json``), the log
            (``train_log.jsonl``) and what the trainer exports; a run in a folder holding a state resumes from it.
        save_every: steps between checkpoints (one is also written at the last step and on the time limit).
        save_minutes: minutes of training after which a checkpoint is written whatever the step (None: by steps
            only), so that slow steps lose little when a run is killed.
        max_minutes: stop after this many minutes of training, after a checkpoint; the same command resumes.
        progress: show a progress bar.
        workers: data-loader worker processes that build the batches ahead of the loop (0: in the training process;
            None: the trainer's choice, else 0).
    """

    output: str
    save_every: int = 50
    save_minutes: float | None = 5.0
    max_minutes: float | None = None
    progress: bool = True
    workers: int | None = None

    def __post_init__(self):
        if self.save_every < 1:
            raise ValueError(f"save_every must be >= 1, got {self.save_every}")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"max_minutes must be > 0, got {self.max_minutes}")
        if self.save_minutes is not None and self.save_minutes <= 0:
            raise ValueError(f"save_minutes must be > 0, got {self.save_minutes}")
        if self.workers is not None and self.workers < 0:
            raise ValueError(f"workers must be >= 0, got {self.workers}")
        check_folder_output(self.output)


class Objective:
    """A trainer's part of the loop; `fit` calls, at step ``s`` (0-based) with ``batch = batches[s]``:
    ``learning_rate(s)``, then ``losses(s, batch)`` (backpropagating each loss before drawing the next), then, after
    clipping and the optimizer step, ``after_step(s)`` and ``record(s, seconds)``; ``save(s + 1)`` before each
    checkpoint (rank 0).

    A subclass sets these attributes in its ``__init__``:

    Attributes:
        modules: the trainable modules by name (names without dots); their state dicts go into the training state and
            are restored on resume. A frozen backbone is not among them.
        optimizer: the optimizer of the modules' trainable parameters; its state is saved and restored.
        batches: a `torch.utils.data.Dataset` (or any indexable) whose item ``s`` is the batch of step ``s``, a pure
            function of the configuration and ``s``; with `RunOptions.workers` it is copied into the worker processes.
        clipped: the parameters whose gradients are clipped to total norm ``grad_clip``; the total norm before
            clipping goes into every record as ``grad_norm``.
        grad_clip: the gradient-norm clip (`torch.nn.utils.clip_grad_norm_`).
        replicated: parameters held whole on every rank under ``torchrun`` (while the backbone is sharded): their
            gradients are summed over the ranks after the last micro-batch. Empty: no all-reduce.
        grad_norms: named parameter lists whose total gradient norm before clipping goes into every record as
            ``<name>_grad_norm`` (a parameter without gradient counts 0).
    """

    modules: dict[str, nn.Module]
    optimizer: torch.optim.Optimizer
    batches: Any
    clipped: list[nn.Parameter]
    grad_clip: float
    replicated: Sequence[nn.Parameter] = ()
    grad_norms: Mapping[str, list[nn.Parameter]] = MappingProxyType({})

    def learning_rate(self, step: int) -> float | Sequence[float]:
        """Learning rate of step ``step``: one for every param group, or one per param group."""
        raise NotImplementedError

    def losses(self, step: int, batch: Any) -> Iterator[torch.Tensor]:
        """Yield the scalar loss of each micro-batch of this rank's share of ``batch``; the engine runs
        ``loss.backward()`` on each before resuming the generator (so per-micro-batch statistics are read after it).
        Under ``torchrun`` the losses of all ranks' micro-batches sum to the step's objective (divide by the global
        number of micro-batches for a mean)."""
        raise NotImplementedError

    def after_step(self, step: int) -> None:
        """Called right after the optimizer step of step ``step`` on every rank (e.g. to project parameters back
        into their range)."""

    def record(self, step: int, seconds: float) -> dict[str, Any] | None:
        """The log record of step ``step`` (called on every rank after the optimizer step; collectives allowed),
        or None to log nothing this step. ``seconds``: training time so far, over all resumed runs. The engine adds
        ``step`` (steps done) first and the gradient norms last."""
        return None

    def postfix(self, record: dict[str, Any]) -> str:
        """Progress-bar text for a record."""
        return ""

    def save(self, step: int) -> None:
        """Export what the trainer ships (e.g. a checkpoint of the trained modules) at a checkpoint after ``step``
        steps; called on rank 0 before the training state is written."""


@dataclass
class RunResult:
    """What `fit` returns.

    Attributes:
        start: the step this run resumed from (0: a fresh run).
        done: steps done (``steps`` when complete).
        log: every record of the run, the resumed ones included.
        seconds: training time over all resumed runs.
        steps: the run's number of steps.
    """

    start: int
    done: int
    log: list[dict[str, Any]]
    seconds: float
    steps: int

    @property
    def complete(self) -> bool:
        return self.done >= self.steps


def fit(
    objective: Objective, options: RunOptions, steps: int, fingerprint: dict[str, Any], ranks: Ranks | None = None,
    desc: str = "train",
) -> RunResult:
    """Run (or resume) steps ``0 … steps - 1`` of ``objective`` into ``options.output``.

    Args:
        objective: the trainer's part.
        options: where to write, how often to save, the time limit, the progress bar, the data workers.
        steps: the run's number of optimizer steps.
        fingerprint: what defines the run (`fingerprint`); a saved state must have the same one.
        ranks: this process among the ``torchrun`` processes (one process by default).
        desc: the progress bar's label.

    Raises:
        ValueError: ``options.output`` holds a state of another configuration.
    """
    from tqdm.auto import tqdm

    ranks = ranks or Ranks()
    output = Path(options.output)
    start, seconds = 0, 0.0
    state = read_state(output)
    if state is not None:
        meta, tensors = state
        check_state(output, meta, tensors, objective, steps, fingerprint)
        _restore(objective, meta, tensors)
        start, seconds = int(meta["step"]), float(meta["trained_seconds"])
    output.mkdir(parents=True, exist_ok=True)
    log = read_jsonl(output / LOG_FILE)
    log = [r for r in log if r["step"] <= start]
    if ranks.is_main:
        write_jsonl(output / LOG_FILE, log)
    loader = torch.utils.data.DataLoader(
        objective.batches, batch_size=None, sampler=range(start, steps), num_workers=options.workers or 0,
        collate_fn=_as_is, prefetch_factor=4 if options.workers else None,
    )
    bar = tqdm(total=steps, initial=start, desc=desc, disable=not (options.progress and ranks.is_main),
               file=sys.stderr)
    began, done = time.monotonic(), start
    saved = began  # when the last checkpoint was written (this run's start for the first)

    def elapsed() -> float:
        return seconds + time.monotonic() - began

    for step, batch in enumerate(loader, start=start):
        rates = objective.learning_rate(step)
        groups = objective.optimizer.param_groups
        rates = [rates] * len(groups) if isinstance(rates, (int, float)) else list(rates)
        for group, rate in zip(groups, rates, strict=True):
            group["lr"] = rate
        objective.optimizer.zero_grad(set_to_none=True)
        for loss in objective.losses(step, batch):
            loss.backward()
        if ranks.world_size > 1 and objective.replicated:
            all_reduce_grads(list(objective.replicated))
        norms = {name: _grad_norm(params) for name, params in objective.grad_norms.items()}
        grad_norm = torch.nn.utils.clip_grad_norm_(objective.clipped, objective.grad_clip)
        objective.optimizer.step()
        check_finite(objective, step + 1, output)
        objective.after_step(step)
        done = step + 1
        bar.update(1)
        record = objective.record(step, elapsed())
        if record is not None:
            record = {"step": done, **record, "grad_norm": float(grad_norm),
                      **{f"{name}_grad_norm": float(norm) for name, norm in norms.items()}}
            log.append(record)
            if ranks.is_main:
                append_jsonl(output / LOG_FILE, json_safe(record))
                bar.set_postfix_str(objective.postfix(record))
        stop = done < steps and _time_is_up(began, options.max_minutes, ranks)
        if done % options.save_every == 0 or done == steps or stop or _save_is_due(saved, options.save_minutes):
            if ranks.is_main:
                objective.save(done)
                save_state(output, done, elapsed(), fingerprint, objective.modules, objective.optimizer)
            saved = time.monotonic()
        if stop:
            break
    bar.close()
    return RunResult(start, done, log, elapsed() if done > start else seconds, steps)


def _as_is(batch: Any) -> Any:
    return batch


def _grad_norm(params: list[nn.Parameter]) -> torch.Tensor:
    return torch.stack([p.grad.norm() if p.grad is not None else p.new_zeros(()) for p in params]).norm()


def check_finite(objective: Objective, step: int, output: Path) -> None:
    """Stop a run whose trainable parameters hold a NaN or an infinity after the optimizer step of step ``step``
    (1-based): a diverged run, usually a learning rate far too large, whose results would mean nothing. Nothing of the
    step is saved: the last checkpoint stays as it was.

    Raises:
        ValueError: naming the step and the first non-finite module.
    """
    for name, module in objective.modules.items():
        params = [p for p in module.parameters() if p.requires_grad]
        if params and not bool(torch.stack([torch.isfinite(p.detach()).all() for p in params]).all()):
            raise ValueError(f"training diverged at step {step}: {name} hold non-finite values (NaN or infinity) after "
                             f"the optimizer step (is a learning rate far too large?); nothing of this step was "
                             f"saved in {output}")


def json_safe(value: Any) -> Any:
    """``value`` (a log record) with every float that JSON cannot hold (NaN, ±infinity), at any depth, as None, so
    the log stays valid JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _save_is_due(saved: float, save_minutes: float | None) -> bool:
    """Whether ``save_minutes`` have passed since the last checkpoint (``saved``, a `time.monotonic` reading). Only
    rank 0 writes a checkpoint and no collective runs in it, so the ranks need not agree on this."""
    return save_minutes is not None and time.monotonic() - saved >= 60 * save_minutes


def _time_is_up(began: float, max_minutes: float | None, ranks: Ranks) -> bool:
    """Whether ``max_minutes`` have passed since ``began``, on any rank (all ranks stop at the same step)."""
    if max_minutes is None:
        return False
    up = time.monotonic() - began > 60 * max_minutes
    if ranks.world_size > 1:
        up = bool(all_reduce_sum(torch.tensor([float(up)]), _collective_device()).item())
    return up


# ---- training state ------------------------------------------------------------------------------------------------


def fingerprint(config: dict[str, Any]) -> dict[str, Any]:
    """The configuration fields that define a run (all but `RESUMABLE`), JSON-normalised (tuples as lists), as saved
    in the training state."""
    return json.loads(json.dumps({k: v for k, v in config.items() if k not in RESUMABLE}))


def check_fingerprint(output: Path, saved: dict[str, Any], current: dict[str, Any]) -> None:
    """Raise one ValueError naming the fields in which ``current`` differs from the ``saved`` fingerprint."""
    if saved == current:
        return
    changed = sorted(k for k in saved.keys() | current.keys() if saved.get(k) != current.get(k))
    raise ValueError(f"{output} holds a training run with a different configuration ({', '.join(changed)}); use "
                     "another --output or delete it")


def check_state(output: Path, record: dict[str, Any], tensors: dict[str, torch.Tensor], objective: Objective,
                steps: int, fingerprint: dict[str, Any]) -> None:
    """Refuse a training state (`read_state`) that this run cannot resume from: its record's fields of the wrong type
    or out of range (``step`` in ``[0, steps]``, ``trained_seconds``, ``fingerprint``, ``modules``, the optimizer's
    ``param_groups`` and scalar ``state``), a configuration other than ``fingerprint`` (`check_fingerprint`), and
    tensors that are not exactly those of the run's modules and optimizer, of their shapes, with finite values.

    Raises:
        ValueError: one line naming the file and the first bad field or tensor.
    """
    path = Path(output) / STATE_TENSORS

    def bad(what: str) -> ValueError:
        return ValueError(f"{path}: {what}; delete it (training restarts) or use another --output")

    step, seconds = record.get("step"), record.get("trained_seconds")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= steps:
        raise bad(f"step must be a whole number in [0, {steps}], got {step!r}")
    if not _number(seconds) or seconds < 0:
        raise bad(f"trained_seconds must be a finite number >= 0, got {seconds!r}")
    if not isinstance(record.get("fingerprint"), dict):
        raise bad(f"fingerprint must be a JSON object (the run's configuration), got {record.get('fingerprint')!r}")
    check_fingerprint(Path(output), record["fingerprint"], fingerprint)
    if record.get("modules") != sorted(objective.modules):
        raise bad(f"modules must be {sorted(objective.modules)} (what this run trains), got {record.get('modules')!r}")
    saved = record.get("optimizer")
    if not isinstance(saved, dict) or not isinstance(saved.get("param_groups"), list) or \
            not isinstance(saved.get("state"), dict):
        raise bad("optimizer must be a JSON object holding param_groups (a list) and state (an object)")
    current = objective.optimizer.state_dict()["param_groups"]
    if len(saved["param_groups"]) != len(current):
        raise bad(f"optimizer.param_groups must hold {len(current)} groups, got {len(saved['param_groups'])}")
    for i, (group, now) in enumerate(zip(saved["param_groups"], current)):
        where = f"optimizer.param_groups[{i}]"
        if not isinstance(group, dict) or set(group) != set(now):
            raise bad(f"{where} must hold the keys {sorted(now)}")
        for key, value in group.items():
            if not _same_kind(value, now[key]) or (key == "params" and value != now[key]):
                raise bad(f"{where}.{key} must be like {now[key]!r}, got {value!r}")
    params = {index: p for group, now in zip(objective.optimizer.param_groups, current)
              for index, p in zip(now["params"], group["params"])}
    for index, values in saved["state"].items():
        if not index.isdigit() or int(index) not in params or not isinstance(values, dict) or \
                not all(_number(v) or isinstance(v, bool) for v in values.values()):
            raise bad(f"optimizer.state[{index!r}] must be an object of numbers of one of the optimizer's parameters")
    expected = {f"{name}.{key}": tuple(value.shape) for name, module in objective.modules.items()
                for key, value in module.state_dict().items()}
    for key, tensor in tensors.items():
        name, _, rest = key.partition(".")
        index, _, state_key = rest.partition(".")
        if name == "optimizer":
            if not index.isdigit() or int(index) not in params or not state_key:
                raise bad(f"tensor {key} belongs to no parameter of the optimizer")
            shape = tuple(params[int(index)].shape) if tensor.dim() else ()
        elif key not in expected:
            raise bad(f"tensor {key} belongs to no module of this run ({', '.join(sorted(objective.modules))})")
        else:
            shape = expected[key]
        if tuple(tensor.shape) != shape:
            raise bad(f"tensor {key} is {list(tensor.shape)}, expected {list(shape)}")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise bad(f"tensor {key} holds a non-finite value")
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise bad(f"tensor {missing[0]} is missing")


def _number(value: Any) -> bool:
    """Whether ``value`` is a finite int or float (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _same_kind(saved: Any, current: Any) -> bool:
    """Whether a JSON value ``saved`` can stand for an optimizer setting ``current``: both None, both bools, both
    numbers (finite), or lists of the same length of such values (a tuple is saved as a list)."""
    if current is None or isinstance(current, bool):
        return saved is current or (isinstance(saved, bool) and isinstance(current, bool))
    if isinstance(current, int | float):
        return _number(saved)
    if isinstance(current, list | tuple):
        return isinstance(saved, list) and len(saved) == len(current) and all(map(_same_kind, saved, current))
    return isinstance(saved, type(current))


def save_state(output: Path, step: int, seconds: float, fingerprint: dict[str, Any], modules: dict[str, nn.Module],
               optimizer: torch.optim.Optimizer) -> None:
    """Write the training state: tensors to ``train_state.safetensors`` (module ``m``'s ``k`` as ``m.k``, the
    optimizer's state ``name`` of parameter ``i`` as ``optimizer.i.name``) with the JSON record in its header, then
    the same record to ``train_state.json``."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for name, module in modules.items():
        if "." in name or name == "optimizer":
            raise ValueError(f"module name {name!r} must not contain a dot nor be 'optimizer'")
        for key, value in module.state_dict().items():
            tensors[f"{name}.{key}"] = _stored(value)
    optim = optimizer.state_dict()
    scalars: dict[str, dict[str, Any]] = {}
    for index, values in optim["state"].items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{index}.{key}"] = _stored(value)
            else:
                scalars.setdefault(str(index), {})[key] = value
    record = {
        "format": STATE_FORMAT, "step": step, "trained_seconds": seconds, "fingerprint": fingerprint,
        "modules": sorted(modules), "optimizer": {"param_groups": optim["param_groups"], "state": scalars},
    }
    header = json.dumps(record)  # raises on anything JSON cannot hold exactly
    with atomic_path(Path(output) / STATE_TENSORS) as tmp:
        save_file(tensors, str(tmp), metadata={"state": header})
    write_json(Path(output) / STATE_JSON, json.loads(header))


def read_state(output: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    """``(record, tensors)`` of the training state in ``output`` (on the CPU), or None when there is none.

    Raises:
        ValueError: the state file is corrupt (truncated, not safetensors, a record that is not JSON) or of another
            format; the message names the file.
    """
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    path = Path(output) / STATE_TENSORS
    if not path.exists():
        return None
    corrupt = f"{path} is corrupt or truncated; delete it (training restarts) or use another --output"
    try:
        with safe_open(str(path), framework="pt") as handle:
            header = (handle.metadata() or {}).get("state")
        if header is None:
            raise ValueError(f"{path} holds no training-state record; delete it or use another --output")
        record = json.loads(header)
        if not isinstance(record, dict):
            raise ValueError(f"{corrupt} (its record is not a JSON object)")
        if record.get("format") != STATE_FORMAT:
            raise ValueError(f"{path} has training-state format {record.get('format')}, expected {STATE_FORMAT}")
        return record, load_file(str(path))
    except json.JSONDecodeError as err:
        raise ValueError(f"{corrupt} (its record is not valid JSON: {err})") from None
    except (SafetensorError, OSError, RuntimeError) as err:
        raise ValueError(f"{corrupt} ({err})") from None


def _stored(value: torch.Tensor) -> torch.Tensor:
    """A CPU copy of its own (safetensors refuses tensors sharing memory)."""
    return value.detach().to("cpu", copy=True).contiguous()


def _restore(objective: Objective, record: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    per_module: dict[str, dict[str, torch.Tensor]] = {}
    optim_state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        name, rest = key.split(".", 1)
        if name == "optimizer":
            index, state_key = rest.split(".", 1)
            optim_state.setdefault(int(index), {})[state_key] = value
        else:
            per_module.setdefault(name, {})[rest] = value
    if sorted(record["modules"]) != sorted(objective.modules):
        raise ValueError(f"the saved training state holds modules {record['modules']}, this run trains "
                         f"{sorted(objective.modules)}")
    for name, module in objective.modules.items():
        module.load_state_dict(per_module.get(name, {}))
    for index, values in record["optimizer"]["state"].items():
        optim_state.setdefault(int(index), {}).update(values)
    groups = [
        {k: tuple(v) if isinstance(current.get(k), tuple) else v for k, v in saved.items()}
        for saved, current in zip(record["optimizer"]["param_groups"], objective.optimizer.param_groups)
    ]
    objective.optimizer.load_state_dict({"state": optim_state, "param_groups": groups})


# ---- devices, precision, determinism, distribution -----------------------------------------------------------------


def training_backend(requested: str | None, device: torch.device) -> str:
    """The differentiable attention backend for ``device``: ``reference`` on CPU, ``flex`` on CUDA by default.

    Raises:
        ValueError: ``requested`` is not differentiable, or not available on ``device``.
    """
    from elastic_bench.kernels import available_backends

    name = requested or ("flex" if device.type == "cuda" else "reference")
    if name not in ("reference", "flex"):
        raise ValueError(f"training needs a differentiable attention backend (reference or flex), got {name!r}")
    if name not in available_backends(device):
        raise ValueError(
            f"attention backend {name!r} is not available on {device} (available: "
            f"{', '.join(available_backends(device))}); train with --backend reference"
        )
    return name


def compile_length(length: int, block_size: int = 128) -> int:
    """The length a training branch of ``length`` tokens is zero-padded to on a compiled backend (``flex`` compiles
    once per sequence length): whole blocks, then one of 4 block counts per octave (4·2^e, 5·2^e, ..., 8·2^e), so at
    most 25% more work. Padding after every real query leaves causal attention of the real tokens unchanged."""
    blocks = -(-length // block_size)
    step = 1 << max(0, blocks.bit_length() - 3)
    return -(-blocks // step) * step * block_size


def autocast(device: torch.device):
    """bf16 autocast on CUDA; a disabled autocast elsewhere (the CPU computes in the model's dtype)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool = True):
    """PyTorch's deterministic kernels for the duration when ``enabled`` (SDPA's flash and memory-efficient backward
    without atomics, a sorted embedding backward, cuBLAS with a fixed workspace): the same seed then gives the same
    weights on the same GPU model and software. The previous setting is restored on exit."""
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts: before the first matmul
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(enabled)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Recompute ``model``'s decoder layers in backward (non-reentrant checkpoints; transformers checkpoints only in
    training mode, so the model is put in it: the LLMs served here have no dropout)."""
    options = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the older name warns there
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
    model.train()


def shard(root: nn.Module, model: nn.Module, device: torch.device) -> None:
    """FSDP2 under ``torchrun``: ``fully_shard`` each decoder layer of ``model`` and then ``root`` (the module whose
    forward the loop calls, e.g. `LossModel`), over all ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in model.base_model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(root, mesh=mesh)


def all_reduce_grads(params: list[nn.Parameter]) -> None:
    """Sum the gradients of ``params`` over the ranks (one flat all-reduce; a missing gradient counts as zeros)."""
    import torch.distributed as dist

    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    for p, g in zip(params, grads):
        p.grad = g
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset: offset + g.numel()].view_as(g))
        offset += g.numel()


def all_reduce_sum(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``values`` summed over the ranks (reduced on ``device``, returned on ``values``' device)."""
    import torch.distributed as dist

    moved = values.to(device)
    dist.all_reduce(moved)
    return moved.to(values.device)


def replica_divergence(params: list[nn.Parameter], ranks: Ranks) -> float:
    """Largest absolute difference between this rank's ``params`` and any other rank's (0.0 in one process)."""
    if ranks.world_size == 1:
        return 0.0
    import torch.distributed as dist

    flat = torch.cat([p.detach().float().flatten() for p in params])
    copies = [torch.empty_like(flat) for _ in range(ranks.world_size)]
    dist.all_gather(copies, flat)
    return max(float((c - flat).abs().max()) for c in copies)


def _collective_device() -> torch.device:
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ---- packed rows ---------------------------------------------------------------------------------------------------


class TextExample(Protocol):
    """What `tokenize` reads of an example: the user prompt, the reference answer and its category name."""

    prompt: str
    answer: str
    category: str


@dataclass(frozen=True)
class TokenizedExample:
    """Token ids of prompt + answer, the prompt length and the category index.

    Attributes:
        input_ids: ``[n]`` int64 token ids, the prompt's first.
        prompt_len: number of prompt tokens.
        category: index of the example's category.
    """

    input_ids: torch.Tensor
    prompt_len: int
    category: int


@dataclass(frozen=True)
class PackedRow:
    """Samples packed into one row (batch 1, varlen).

    Attributes:
        input_ids: ``[T]`` token ids.
        targets: ``[T]`` next-token targets, ``-100`` where no loss is taken.
        position_ids: ``[T]`` positions restarting at 0 in each sample.
        cu_seqlens: ``[N + 1]`` int32 sample boundaries.
        prompt_lens: prompt length of each of the N samples.
        categories: ``[N]`` int64 category index of each sample.
    """

    input_ids: torch.Tensor
    targets: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    prompt_lens: list[int]
    categories: torch.Tensor

    @property
    def num_samples(self) -> int:
        return len(self.prompt_lens)


def tokenize(
    examples: Sequence[TextExample], tokenizer, categories: list[str], max_tokens: int, progress: bool = False,
    truncate: bool = True,
) -> list[TokenizedExample]:
    """Token ids (chat template + answer + EOS) of each example, middle-truncated to ``max_tokens`` (``truncate``;
    else kept whole, unless its text is so long that it cannot fit: `within_reach`); ``categories`` gives each
    category name its index."""
    from tqdm.auto import tqdm

    from elastic_bench.tasks.base import render

    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token to end answers with")
    index = {c: i for i, c in enumerate(categories)}
    out = []
    for ex in tqdm(examples, desc="tokenizing", disable=not progress, leave=False):
        prompt = render(tokenizer, within_reach(ex.prompt, max_tokens))
        answer = tokenizer(within_reach(ex.answer, max_tokens), add_special_tokens=False).input_ids + \
            [tokenizer.eos_token_id]
        excess = len(prompt) + len(answer) - max_tokens
        if excess > 0 and truncate:
            if excess > len(prompt) - 2:
                raise ValueError(f"an answer of {len(answer)} tokens does not fit max_tokens={max_tokens}")
            head = (len(prompt) - excess) // 2
            prompt = prompt[:head] + prompt[head + excess :]
        ids = torch.tensor(prompt + answer, dtype=torch.int64)
        out.append(TokenizedExample(ids, len(prompt), index[ex.category]))
    return out


CHARS_PER_TOKEN = 64
"""More characters than a tokenizer puts into one of its tokens on average (a few for natural text and code)."""


def within_reach(text: str, max_tokens: int) -> str:
    """``text`` cut in its middle to ``CHARS_PER_TOKEN × max_tokens`` characters: a longer text has more than
    ``max_tokens`` tokens, so it loses its middle (or is left out) after tokenizing anyway, and a huge record is never
    tokenized whole."""
    most = CHARS_PER_TOKEN * max_tokens
    if len(text) <= most:
        return text
    return text[: most // 2] + text[len(text) - (most - most // 2):]


def in_range(samples: list[TokenizedExample], min_tokens: int, max_tokens: int,
             categories: list[str]) -> list[TokenizedExample]:
    """The samples of ``min_tokens`` to ``max_tokens`` tokens, in order: the official Elastic Attention packing leaves
    out the samples outside 1K-64K tokens.

    Raises:
        ValueError: a category of ``categories`` has no sample left (one line naming it and the range).
    """
    kept = [s for s in samples if min_tokens <= len(s.input_ids) <= max_tokens]
    empty = sorted({s.category for s in samples} - {s.category for s in kept})
    if empty:
        raise ValueError(f"no {categories[empty[0]]} sample has {min_tokens}-{max_tokens} tokens (the others are left "
                         "out); widen the range or middle-truncate the long ones with --length-rule truncate")
    return kept


def pack(samples: list[TokenizedExample], pack_tokens: int, loss_tokens: LossTokens = "answer") -> list[PackedRow]:
    """First-fit-decreasing packing into rows of at most ``pack_tokens`` tokens (deterministic)."""
    if loss_tokens not in ("all", "answer"):
        raise ValueError(f"loss_tokens must be 'all' or 'answer', got {loss_tokens!r}")
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i].input_ids), i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = len(samples[i].input_ids)
        if n > pack_tokens:
            raise ValueError(f"a sample of {n} tokens exceeds pack_tokens={pack_tokens}; lower max_tokens")
        slot = next((b for b, free in enumerate(room) if free >= n), None)
        if slot is None:
            bins.append([])
            room.append(pack_tokens)
            slot = len(bins) - 1
        bins[slot].append(i)
        room[slot] -= n
    return [_row([samples[i] for i in members], loss_tokens) for members in bins]


def _row(members: list[TokenizedExample], loss_tokens: LossTokens) -> PackedRow:
    ids, targets, positions = [], [], []
    for s in members:
        n = len(s.input_ids)
        target = torch.full((n,), -100, dtype=torch.int64)
        target[:-1] = s.input_ids[1:]
        if loss_tokens == "answer":
            target[: s.prompt_len - 1] = -100
        ids.append(s.input_ids)
        targets.append(target)
        positions.append(torch.arange(n))
    lengths = torch.tensor([len(s.input_ids) for s in members])
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(torch.int32)
    return PackedRow(
        torch.cat(ids), torch.cat(targets), torch.cat(positions), cu,
        [s.prompt_len for s in members], torch.tensor([s.category for s in members], dtype=torch.int64),
    )


def row_inputs(row: PackedRow, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """`LossModel`'s positional inputs for ``row`` on ``device``: ``input_ids [T]``, ``position_ids [T]``,
    ``cu_seqlens [N + 1]``, the longest sample's length, ``targets [T]``."""
    max_len = int((row.cu_seqlens[1:] - row.cu_seqlens[:-1]).max())
    return (row.input_ids.to(device), row.position_ids.to(device), row.cu_seqlens.to(device), max_len,
            row.targets.to(device))


class LossModel(nn.Module):
    """A causal LM plus its chunked token cross-entropy over one packed row; the FSDP2 root under ``torchrun``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int,
        targets: torch.Tensor | None, training_route: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Packed row ``input_ids/position_ids/targets [T]``, ``cu_seqlens [N + 1]`` → (summed CE, token count);
        None without targets (a routing-only forward). ``training_route`` (when given) is passed to the model's
        forward as the keyword of that name, which transformers hands down to the attention function
        (`elastic_bench.modeling.interface.AttentionCall.training_route`); a layer recomputed in backward gets it
        again."""
        extra = {} if training_route is None else {"training_route": training_route}
        if len(cu_seqlens) > 2:  # several samples: kept apart (a row of one is a plain sequence, which a
            extra |= dict(cu_seq_lens_q=cu_seqlens, cu_seq_lens_k=cu_seqlens, max_length_q=max_len,  # model's
                          max_length_k=max_len)  # linear-attention layers take without flash-linear-attention)
        hidden = self.model.base_model(
            input_ids=input_ids[None], position_ids=position_ids[None], use_cache=False, **extra,
        ).last_hidden_state[0]
        if targets is None:
            return None
        head = self.model.get_output_embeddings()
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, hidden.shape[0], LOSS_CHUNK):
            piece = slice(start, start + LOSS_CHUNK)
            total = total + torch.utils.checkpoint.checkpoint(
                _chunk_cross_entropy, hidden[piece], targets[piece], head, use_reentrant=False
            )
        return total, (targets != -100).sum()


def _chunk_cross_entropy(hidden: torch.Tensor, targets: torch.Tensor, head: nn.Module) -> torch.Tensor:
    logits = head(hidden).float()
    return torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")
