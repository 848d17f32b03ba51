"""lm-evaluation-harness bridge: lm-eval's tasks on a model running under an elastic-bench method.

Command line: ``elastic-bench lm-eval run --model elastic --model_args
pretrained=testbed,method=streaming,method_local=256 --tasks ...`` (every lm-eval flag works; ``--device`` is lm-eval's
own). Python: ``ElasticLM(pretrained="tiny:qwen3", method="streaming")`` passed to ``lm_eval.simple_evaluate``.
Scores follow lm-eval's protocol (its prompts, truncation and scorers), which differs from the official ones that
``elastic-bench run`` reproduces: label such numbers "lm-eval protocol" (docs/benchmarks.md). Needs the ``lm-eval``
extra.

Design decisions:
- Model arguments are lm-eval's own (`HFLM`'s), ``method=``, ``method_<knob>=`` (typed with the knob's field type:
  ``true/false/yes/no/none`` and numbers are converted) and ``kernel_backend=``; any other name is refused in one line
  naming the closest valid ones.
- Every row is planned on its own tokens. lm-eval right-pads loglikelihood batches and passes no attention mask; the
  bridge records the true row lengths as lm-eval pads them and runs the forward left-aligned with a 2-D mask and
  explicit positions, so routing and sparsity of a row do not depend on its neighbours (generation is left-padded
  with a mask already).
- Requests are run one task at a time; ``handle.stats()`` of each (task, request type) is kept, returned by
  `ElasticLM.get_model_info` (so it lands in lm-eval's results under ``config.elastic_bench``) and written as
  ``sparsity_<date>.json`` beside lm-eval's ``results_<date>.json`` when lm-eval saves its results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from lm_eval.api.registry import register_model
from lm_eval.loggers import EvaluationTracker
from lm_eval.models import huggingface
from lm_eval.models.huggingface import HFLM

from elastic_bench.attention import apply
from elastic_bench.files import write_json
from elastic_bench.interface import REGISTRY, get_method
from elastic_bench.kernels import Mode
from elastic_bench.models import check_device, load_model
from elastic_bench.options import check_value
from elastic_bench.registry import did_you_mean

HFLM_ARGS = [name for name in inspect.signature(HFLM.__init__).parameters if name not in ("self", "kwargs")]
OUR_ARGS = ["method", "kernel_backend"]
WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False, "none": None, "null": None}
logger = logging.getLogger(__name__)
REPORT_KEY = "elastic_bench"  # where the method and its sparsity go in lm-eval's results config


@register_model("elastic")
class ElasticLM(HFLM):
    """lm-eval's Hugging Face model with an elastic-bench method applied for the object's lifetime.

    Args:
        pretrained: model spec (``tiny:qwen3``, ``testbed``, a local path or hub id).
        method: registered method name; its knobs are given as ``method_<knob>=value``.
        kernel_backend: kernel backend of `hybrid_attention` (``auto``, ``reference``, ``triton``, ...).
        dtype: weights dtype (``"bfloat16"``, ``torch.float32``, ...); ``"auto"`` or None: bf16 on CUDA, fp32 on CPU.
        device: ``"cuda"``, ``"cpu"``, ...; None: CUDA when available, else the CPU (as lm-eval's ``hf``).
        **kwargs: ``method_<knob>`` values and the remaining `HFLM` arguments (``batch_size``, ``max_length``, ...).

    Raises:
        ValueError: an argument that is neither lm-eval's nor ours, or a knob value of the wrong type (one line).
    """

    def __init__(self, pretrained: str = "tiny:qwen3", method: str = "full", kernel_backend: str = "auto",
                 dtype: str | torch.dtype | None = "auto", device: str | None = None, **kwargs: Any):
        self.method = build_method(method, kwargs)
        model, tokenizer = load_model(str(pretrained), dtype=_dtype(dtype), device=_device(device))
        self._applied = apply(self.method, model, backend=kernel_backend)
        self.handle = self._applied.__enter__()
        self._row_lengths: list[int] | None = None  # true lengths of the rows of the batch lm-eval just padded
        self.sparsity: dict[str, dict[str, Any]] = {}  # "task/request type" → stats of its requests
        kwargs.setdefault("tokenizer", tokenizer)
        super().__init__(pretrained=model, **kwargs)

    def close(self) -> None:
        """Restore the model's own attention."""
        self._applied.__exit__(None, None, None)

    # ---- per-task requests and their sparsity ------------------------------------------------------------------

    def loglikelihood(self, requests: list, disable_tqdm: bool = False) -> list:
        return self._per_task(super().loglikelihood, requests, disable_tqdm)

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list:
        return self._per_task(super().loglikelihood_rolling, requests, disable_tqdm)

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list:
        return self._per_task(super().generate_until, requests, disable_tqdm)

    def _per_task(self, run: Callable[..., list], requests: list, disable_tqdm: bool) -> list:
        """Run ``requests`` (lm-eval `Instance`s) one task at a time, keeping each task's ``handle.stats()``;
        results come back in the order of ``requests``."""
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(f"{request.task_name}/{request.request_type}", []).append(i)
        results: list[Any] = [None] * len(requests)
        for key, indices in groups.items():
            self.handle.reset()
            for i, result in zip(indices, run([requests[i] for i in indices], disable_tqdm=disable_tqdm)):
                results[i] = result
            self.sparsity[key] = self._summary()
        return results

    def _summary(self) -> dict[str, Any]:
        """The handle's statistics since its last reset, without per-sample values, plus ``fraction_full``: the
        share of FULL heads per layer ``[L]`` over the recorded samples."""
        stats = {key: value for key, value in self.handle.stats().items() if key != "per_sample"}
        decisions = self.handle.decisions()  # [N, L, H]
        stats["fraction_full"] = (decisions == Mode.FULL).float().mean(dim=(0, 2)).tolist() if decisions.numel() else []
        return {key: None if isinstance(value, float) and math.isnan(value) else value for key, value in stats.items()}

    def get_model_info(self) -> dict:
        """lm-eval's model information plus the method (name, label, options) and the sparsity of each task."""
        method = {"name": self.method.name, "label": self.method.label(), "options": self.method.options()}
        return {**super().get_model_info(), REPORT_KEY: {"method": method, "sparsity": self.sparsity}}

    # ---- right-padded batches ----------------------------------------------------------------------------------

    def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False, override_bs: int | None = None):
        with self._recording_row_lengths():
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)

    @contextlib.contextmanager
    def _recording_row_lengths(self) -> Iterator[None]:
        """While lm-eval builds loglikelihood batches, note the true length of each row it right-pads."""
        pad_and_concat = huggingface.pad_and_concat

        def recording(max_length: int, tensors: list[torch.Tensor], padding_side: str = "right") -> torch.Tensor:
            if padding_side == "right":
                self._row_lengths = [t.shape[0] for t in tensors]
            return pad_and_concat(max_length, tensors, padding_side=padding_side)

        huggingface.pad_and_concat = recording
        try:
            yield
        finally:
            huggingface.pad_and_concat = pad_and_concat
            self._row_lengths = None

    def _model_call(self, inps: torch.Tensor, attn_mask: torch.Tensor | None = None,
                    labels: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[B, P, V]`` of ``inps [B, P]``; a batch lm-eval right-padded runs left-aligned (`left_aligned`)."""
        lengths, self._row_lengths = self._row_lengths, None
        if lengths is None or attn_mask is not None or min(lengths) == inps.shape[1]:
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
        if len(lengths) != inps.shape[0] or max(lengths) > inps.shape[1]:
            raise RuntimeError(f"row lengths {lengths} do not fit the batch {tuple(inps.shape)}")
        with torch.no_grad(), torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                                             enabled=self.mixed_precision_dtype is not None):
            return left_aligned(self.model, inps, torch.tensor(lengths, device=inps.device))


def left_aligned(model: torch.nn.Module, inps: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Logits ``[B, P, V]`` of the right-padded ``inps [B, P]`` (row i holds ``lengths[i]`` tokens, then padding),
    computed with every row moved to the right end (left padding, a 2-D attention mask, positions from 0 at each
    row's first token) and moved back: row i's logits ``[:lengths[i]]`` are its own; the rest are padding's."""
    B, P = inps.shape
    steps = torch.arange(P, device=inps.device).expand(B, P)
    shift = (P - lengths)[:, None]  # [B, 1] padding of each row
    left = inps.gather(1, (steps - shift) % P)  # row i rotated right by shift[i]
    mask = steps >= shift
    positions = (steps - shift).clamp(min=0)
    logits = model(input_ids=left, attention_mask=mask.long(), position_ids=positions).logits
    back = ((steps + shift) % P)[..., None].expand(-1, -1, logits.shape[-1])
    return logits.gather(1, back)


# ---- model arguments ---------------------------------------------------------------------------------------------


def build_method(name: str, kwargs: dict[str, Any]):
    """The method ``name`` with the ``method_<knob>`` entries of ``kwargs`` (removed from it), typed by the knob's
    field type; every other entry must be an `HFLM` argument.

    Raises:
        ValueError: an unknown argument or knob, or a value that does not fit its knob (one line).
    """
    cls = REGISTRY.get(name)
    knobs = [f.name for f in dataclasses.fields(cls)]
    valid = [*HFLM_ARGS, *OUR_ARGS, *(f"method_{knob}" for knob in knobs)]
    for key in kwargs:
        if key not in valid:
            raise did_you_mean(f"model argument of `elastic` (method {name!r})", key, valid)
    values = {key.removeprefix("method_"): kwargs.pop(key) for key in list(kwargs) if key.startswith("method_")}
    return get_method(name, **{knob: typed(cls, knob, value) for knob, value in values.items()})


def typed(cls: type, knob: str, value: Any) -> Any:
    """``value`` as the type of field ``knob`` of the method dataclass ``cls`` wants it: a command-line string is
    read as a bool (``true/false/yes/no/on/off``), None (``none/null``), an int or a float where the field takes no
    string; a number lm-eval already converted is taken back as a string where only a string fits."""
    where = f"method_{knob}"
    try:
        return check_value(cls, knob, value, where)
    except ValueError as err:
        candidates = [_word(value)] if isinstance(value, str) else [str(value)]
        for candidate in candidates:
            with contextlib.suppress(ValueError):
                return check_value(cls, knob, candidate, where)
        raise err from None


def _word(text: str) -> Any:
    """A command-line value read as a bool, None, int or float (else the text itself)."""
    lower = text.strip().lower()
    if lower in WORDS:
        return WORDS[lower]
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(lower)
    return text


def _device(spec: str | None) -> torch.device:
    """The device ``spec`` names; as lm-eval's ``hf``, one this machine lacks (lm-eval's command-line default
    ``cuda:0`` on a CPU machine, say) or None gives CUDA when available, else the CPU.

    Raises:
        ValueError: ``spec`` is not a device name (one line).
    """
    try:
        requested = None if spec is None else torch.device(spec)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be cpu, cuda or cuda:N (e.g. cuda:0), got {spec!r}") from None
    try:
        return check_device(requested)
    except ValueError:
        fallback = check_device(None)
        logger.warning("device %s is not available; using %s", spec, fallback)
        return fallback


def _dtype(spec: str | torch.dtype | None) -> torch.dtype | None:
    """The weights dtype ``spec`` names; None (the loader's default) for ``"auto"`` or None."""
    if isinstance(spec, torch.dtype):
        return spec
    if spec is None or spec == "auto":
        return None
    dtype = getattr(torch, str(spec), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be auto or a torch dtype name (bfloat16, float16, float32), got {spec!r}")
    return dtype


# ---- the sparsity file beside lm-eval's results ------------------------------------------------------------------


def sparsity_path(tracker: EvaluationTracker) -> Path:
    """Where ``sparsity_<date>.json`` goes: beside the ``results_<date>.json`` lm-eval's tracker just wrote."""
    path = Path(tracker.output_path)
    if path.suffix == ".json":
        return path.parent / f"sparsity_{tracker.date_id}.json"
    return path / str(tracker.general_config_tracker.model_name_sanitized) / f"sparsity_{tracker.date_id}.json"


def _also_save_sparsity(save: Callable[..., None]) -> Callable[..., None]:
    """Wrap `EvaluationTracker.save_results_aggregated` so that an elastic run's sparsity is written beside it."""

    @functools.wraps(save)
    def save_results_aggregated(tracker: EvaluationTracker, results: dict, samples: dict | None = None) -> None:
        save(tracker, results=results, samples=samples)
        report = results.get("config", {}).get(REPORT_KEY)
        if report is not None and tracker.output_path:
            write_json(sparsity_path(tracker), report)

    save_results_aggregated.elastic_bench = True
    return save_results_aggregated


if not getattr(EvaluationTracker.save_results_aggregated, "elastic_bench", False):
    EvaluationTracker.save_results_aggregated = _also_save_sparsity(EvaluationTracker.save_results_aggregated)


def cli(argv: list[str]) -> int:
    """Run lm-eval's command line with the ``elastic`` model registered."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *argv]
    cli_evaluate()
    return 0
