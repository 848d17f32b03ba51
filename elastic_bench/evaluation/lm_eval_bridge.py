"""lm-evaluation-harness bridge: lm-eval's tasks on a model running under an elastic-bench method.

Command line: ``elastic-bench lm-eval run --model elastic --model_args
pretrained=testbed,method=streaming,method_local=256 --tasks ...`` (every lm-eval flag works; ``--device`` is lm-eval's
own). Python: ``ElasticLM(pretrained="tiny:qwen3", method="streaming")`` passed to ``lm_eval.simple_evaluate``, or
``model="elastic"`` once this module is imported (importing it registers the model with lm-eval's model registry,
its public extension point, and changes nothing else in lm-eval; lm-eval releases that discover plugins read the
``lm_eval.models`` entry point instead, ``pyproject.toml``). Scores follow lm-eval's
protocol (its prompts, truncation and scorers), which differs from the official ones that ``elastic-bench run``
reproduces: label such numbers "lm-eval protocol" (docs/benchmarks.md). Needs the ``lm-eval`` extra.

Design decisions:
- Model arguments are lm-eval's own (`HFLM`'s), ``method=``, ``method_<knob>=`` (typed with the knob's field type:
  ``true/false/yes/no/none`` and numbers are converted), ``kernel_backend=`` and ``tp=``; any other name is refused in
  one line naming the closest valid ones.
- User errors end in one line before anything loads: `plan_model` checks the model's arguments (and reads the model's
  config) before any weights load; the command line (`cli`) also checks them, with lm-eval's parser, configuration
  and task list, before lm-eval runs, holding back what lm-eval prints meanwhile, then lets lm-eval run on the
  configuration and tasks it read.
- Every row is planned on its own tokens. lm-eval right-pads loglikelihood batches and passes no attention mask; the
  bridge records the true row lengths as lm-eval pads them and runs the forward left-aligned with a 2-D mask and
  explicit positions, so routing and sparsity of a row do not depend on its neighbours (generation is left-padded
  with a mask already).
- Greedy generation runs the harness's own batched loop (`elastic_bench.modeling.generation.generate`, as
  ``elastic-bench run`` does): each row stops at the model's end-of-sequence ids or once one of lm-eval's stop strings
  appears in its last tokens (as lm-eval's stopping criterion reads them) and then leaves the batch; lm-eval cuts the
  text at its stop strings as with transformers' ``generate``, which still runs sampled generation.
- Requests are run one task at a time; ``handle.stats()`` of each (task, request type) is kept, returned by
  `ElasticLM.get_model_info` (so it lands in lm-eval's results under ``config.elastic_bench``) and written as
  ``sparsity_<date>.json`` beside lm-eval's ``results_<date>.json`` when lm-eval saves its results.
- Each request's own sparsity goes into lm-eval's logged samples. lm-eval sorts and batches requests, lets requests
  with one-token continuations share a row, and splits a rolling document into windows, so while a task runs the
  bridge notes every row it forwards (row i is sample i of ``handle.stats()["per_sample"]``) and, through a subclass
  of lm-eval's own `Collator`, which row each result came from (`_RowLog`). When lm-eval's ``evaluate`` returns its
  samples, each gets the field ``elastic_bench`` (`ElasticLM.add_sample_sparsity`), which ``--log_samples`` writes
  into ``samples_<task>_<date>.jsonl`` with the rest. Requests are matched by their arguments, which decide their
  rows: equal arguments have equal sparsity.
- Processes: given a loaded model, lm-eval's `HFLM` forgoes its distributed setup (rank 0, world size 1), so under
  ``torchrun`` every process evaluates every request and only ``LOCAL_RANK`` 0 writes files; its samples carry every
  request's values. With ``tp=N`` the model is sharded over ``N`` ranks as ``run --tp`` shards it (`load_model`'s
  ``tp``); the ranks run the same requests in the same order, so `MethodHandle.stats` / ``decisions`` (collectives
  that join the ranks' heads) are called alike on every rank and give one process's sparsity.
- lm-eval's internals: the model is `HFLM` subclassed and registered; what lm-eval has no hook for is one patch
  (`LM_EVAL_PATCH`, its docstring names each attribute and why), held only while an elastic model is open or `cli`
  runs, and put back after.
- Length: the module is over 500 lines because it is one adapter to one outside API (the model, its rows, its
  arguments and lm-eval's command line each read lm-eval's internals); split, each part would import the others'
  private helpers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import io
import itertools
import json
import logging
import math
import sys
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from lm_eval import evaluator
from lm_eval import utils as lm_eval_utils
from lm_eval.api.model import CachingLM
from lm_eval.api.registry import register_model
from lm_eval.loggers import EvaluationTracker
from lm_eval.models import huggingface
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import Collator

from elastic_bench.foundation.files import write_json
from elastic_bench.foundation.options import CommandLineText, check_value
from elastic_bench.foundation.registry import did_you_mean
from elastic_bench.kernels import Mode, causal_pairs, sample_means
from elastic_bench.modeling.attention import apply
from elastic_bench.modeling.generation import LeftPadded, generate, stop_ids
from elastic_bench.modeling.interface import REGISTRY, Method, get_method
from elastic_bench.modeling.loading import (
    ModelSource,
    check_backend,
    check_device,
    check_placement,
    load_model,
    resolve_model,
    torchrun_world_size,
)
from elastic_bench.modeling.tensor_parallel import tensor_parallel
from elastic_bench.training.distributed import Ranks

HFLM_ARGS = [name for name in inspect.signature(HFLM.__init__).parameters if name not in ("self", "kwargs")]
OUR_ARGS = ["method", "kernel_backend", "tp"]
logger = logging.getLogger(__name__)
REPORT_KEY = "elastic_bench"  # where the method and its sparsity go in lm-eval's results config and samples
GREEDY_KWARGS = {"attention_mask", "do_sample", "temperature", "top_p", "top_k"}  # what greedy generation may be given
TESTBED_TEXT = ("the testbed model cannot model real text: it was trained on the testbed's synthetic needle and copy "
                "tasks only, with a word-level vocabulary of their words, so the loglikelihoods of task {task} say "
                "nothing (its byte perplexity on natural text is in the hundreds); evaluate a pretrained model")


@register_model("elastic")
class ElasticLM(HFLM):
    """lm-eval's Hugging Face model with an elastic-bench method applied for the object's lifetime.

    Args:
        pretrained: model spec (``tiny:qwen3``, ``testbed``, a local path or hub id).
        method: registered method name; its knobs are given as ``method_<knob>=value``.
        kernel_backend: kernel backend of `hybrid_attention` (``auto``, ``reference``, ``triton``, ...).
        dtype: weights dtype (``"bfloat16"``, ``torch.float32``, ...); ``"auto"`` or None: bf16 on CUDA, fp32 on CPU.
        device: ``"cuda"``, ``"cpu"``, ...; None: CUDA when available, else the CPU (as lm-eval's ``hf``). Under
            tensor parallelism, each rank takes the device of its ``LOCAL_RANK`` of that type (``cuda:<local rank>``).
        tp: ranks per model under ``torchrun``: the model sharded by transformers' tensor-parallel plan, as ``run
            --tp`` shards it (`elastic_bench.modeling.tensor_parallel`); every rank runs every request and the
            sparsity is that of one process holding every head.
        **kwargs: ``method_<knob>`` values and the remaining `HFLM` arguments (``batch_size``, ``max_length``, ...).

    Raises:
        ValueError: any argument `plan_model` refuses (one line), before the model loads.
    """

    def __init__(self, pretrained: str = "tiny:qwen3", method: str = "full", kernel_backend: str = "auto",
                 dtype: str | torch.dtype | None = "auto", device: str | None = None, tp: int | str = 1,
                 **kwargs: Any):
        plan = plan_model(pretrained, method, kernel_backend, dtype, device, tp, kwargs)
        if plan.fell_back:
            logger.warning("device %s is not available; using %s", device, plan.device)
        self.method = plan.method
        self._testbed = plan.source.kind == "testbed"  # warned about when it scores text (`TESTBED_TEXT`)
        model, tokenizer = load_model(plan.source, dtype=plan.dtype, device=_rank_device(plan), tp=plan.tp)
        self._open = contextlib.ExitStack()  # what `close` undoes: lm-eval's patch held, the method applied
        self._open.enter_context(LM_EVAL_PATCH.held())
        LM_EVAL_PATCH.models.add(self)
        self.handle = self._open.enter_context(apply(self.method, model, backend=kernel_backend))
        self._rows: _RowLog | None = None  # the rows of the (task, request type) running now
        self.sparsity: dict[str, dict[str, Any]] = {}  # "task/request type" → stats of its requests
        self.per_request: dict[str, dict[str, Any] | None] = {}  # `request_key` → the request's `combined` sparsity
        kwargs.setdefault("tokenizer", tokenizer)
        try:
            super().__init__(pretrained=model, **kwargs)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Restore the model's own attention and let go of lm-eval's patch (`LM_EVAL_PATCH`); a second call does
        nothing."""
        LM_EVAL_PATCH.models.discard(self)
        self._open.close()

    # ---- per-task requests and their sparsity ------------------------------------------------------------------

    def loglikelihood(self, requests: list, disable_tqdm: bool = False) -> list:
        return self._per_task(super().loglikelihood, requests, disable_tqdm)

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list:
        return self._per_task(super().loglikelihood_rolling, requests, disable_tqdm)

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list:
        return self._per_task(super().generate_until, requests, disable_tqdm)

    def _per_task(self, run: Callable[..., list], requests: list, disable_tqdm: bool) -> list:
        """Run ``requests`` (lm-eval `Instance`s) one task at a time, keeping each task's ``handle.stats()`` and each
        request's sparsity (`per_request`); results come back in the order of ``requests``."""
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(f"{request.task_name}/{request.request_type}", []).append(i)
        results: list[Any] = [None] * len(requests)
        for key, indices in groups.items():
            group = [requests[i] for i in indices]
            if self._testbed and group[0].request_type.startswith("loglikelihood"):
                logger.warning(TESTBED_TEXT.format(task=group[0].task_name))
            self.handle.reset()
            with self._logging_rows() as rows:
                if group[0].request_type == "loglikelihood_rolling":
                    rows.windows = [self._window_count(request.args[0]) for request in group]
                for i, result in zip(indices, run(group, disable_tqdm=disable_tqdm)):
                    results[i] = result
            stats = self.handle.stats()
            per_sample = stats["per_sample"]
            request_rows = rows.of_requests(len(group), len(per_sample))
            for request, used in zip(group, request_rows, strict=True):
                # keyed after the run: the arguments as lm-eval logs them
                self.per_request[request_key(request.args)] = combined(
                    [per_sample[row] for row in used], [rows.tokens[row] for row in used])
            self.sparsity[key] = self._summary(stats, sorted({row for used in request_rows for row in used}), rows)
        return results

    def _window_count(self, text: str) -> int:
        """How many windows `HFLM.loglikelihood_rolling` splits the document ``text`` into: lm-eval's
        `get_rolling_token_windows` called as that method calls it (`_RowLog.of_requests` refuses counts that do not
        match the rows lm-eval ran)."""
        windows = lm_eval_utils.get_rolling_token_windows(token_list=self.tok_encode(text),
                                                          prefix_token=self.prefix_token_id,
                                                          max_seq_len=self.max_length, context_len=1)
        return sum(1 for _ in windows)

    def _summary(self, stats: dict[str, Any], rows: list[int], log: _RowLog) -> dict[str, Any]:
        """The handle's ``stats`` over the samples ``rows`` (the rows of requests: not lm-eval's batch-size
        detection), without per-sample values, plus ``fraction_full``: the share of FULL heads per layer ``[L]``
        over those samples, and ``kv_bytes`` / ``kv_bytes_full``: the mean over the generated rows of what each row's
        cache kept when it finished (`_RowLog.kv_bytes`; absent where no row generated). The handle's own
        ``kv_bytes`` are those of the last forward's cache, a whole batch's, and are left out."""
        samples = [stats["per_sample"][row] for row in rows]
        stats = {key: value for key, value in stats.items() if key not in ("per_sample", "kv_bytes", "kv_bytes_full")}
        stats.update(sample_means(samples), num_samples=len(samples))
        kept = [log.kv_bytes[row] for row in rows if row in log.kv_bytes]
        if kept:
            totals = (sum(k for k, _ in kept), sum(f for _, f in kept))
            shard = tensor_parallel(self.model)  # a tensor-parallel rank's rows hold its heads: summed over the ranks
            held, full = shard.sum(totals) if shard else totals
            stats.update(kv_bytes=held / len(kept), kv_bytes_full=full / len(kept))
        decisions = self.handle.decisions()[rows]  # [N, L, H]
        stats["fraction_full"] = (decisions == Mode.FULL).float().mean(dim=(0, 2)).tolist() if decisions.numel() else []
        return {key: None if isinstance(value, float) and math.isnan(value) else value for key, value in stats.items()}

    def add_sample_sparsity(self, samples: dict[str, list[dict]]) -> None:
        """Give every sample lm-eval logged (``results["samples"]``: task → sample dicts) the field
        ``elastic_bench``: the `combined` sparsity of each of its requests, in the order of its ``arguments`` (a
        multiple-choice document has one request per choice); null for a request this model did not compute (one
        lm-eval answered from its ``--use_cache`` database)."""
        for task_samples in samples.values():
            for sample in task_samples:
                sample[REPORT_KEY] = [self.per_request.get(request_key(args)) for args in sample["arguments"]]

    def get_model_info(self) -> dict:
        """lm-eval's model information plus the method (name, label, options) and the sparsity of each task."""
        method = {"name": self.method.name, "label": self.method.label(), "options": self.method.options()}
        return {**super().get_model_info(), REPORT_KEY: {"method": method, "sparsity": self.sparsity}}

    # ---- the rows of lm-eval's batches -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _logging_rows(self) -> Iterator[_RowLog]:
        """While lm-eval runs one group of requests: note the true length of each row it right-pads, which row
        each result comes from (`_RowCollator`), both through `LM_EVAL_PATCH`, which this model holds."""
        rows = _RowLog()
        self._rows, LM_EVAL_PATCH.rows = rows, rows
        try:
            yield rows
        finally:
            self._rows, LM_EVAL_PATCH.rows = None, None

    def _model_call(self, inps: torch.Tensor, attn_mask: torch.Tensor | None = None,
                    labels: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[B, P, V]`` of ``inps [B, P]``; a batch lm-eval right-padded runs left-aligned (`left_aligned`).
        A batch lm-eval did not pad (its batch-size detection) is noted as rows of no request."""
        lengths = self._rows.take_padded() if self._rows is not None else None
        if self._rows is not None:
            self._rows.add(lengths or [inps.shape[1]] * inps.shape[0], requests=lengths is not None)
        if lengths is None or attn_mask is not None or min(lengths) == inps.shape[1]:
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
        if len(lengths) != inps.shape[0] or max(lengths) > inps.shape[1]:
            raise RuntimeError(f"row lengths {lengths} do not fit the batch {tuple(inps.shape)}")
        with torch.no_grad(), torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                                             enabled=self.mixed_precision_dtype is not None):
            return left_aligned(self.model, inps, torch.tensor(lengths, device=inps.device))

    def _model_generate(self, context: torch.Tensor, max_length: int, stop: list[str], **generation_kwargs: Any):
        """lm-eval's generation of the left-padded ``context [B, P]`` up to ``max_length`` tokens in all → ``[B, P +
        new]`` (rows that stopped early end in their stop token, then padding); its prompt rows are noted. Greedy
        generation runs `elastic_bench.modeling.generation.generate`, anything else transformers' ``generate``."""
        mask = generation_kwargs.get("attention_mask")  # [B, P]
        lengths = mask.sum(dim=1).tolist() if mask is not None else [context.shape[1]] * context.shape[0]
        first = len(self._rows.tokens) if self._rows is not None else 0  # the batch's first row in the log
        if self._rows is not None:
            self._rows.add(lengths)
        greedy = not generation_kwargs.get("do_sample") and not generation_kwargs.get("temperature")
        if not greedy or set(generation_kwargs) - GREEDY_KWARGS:
            return super()._model_generate(context, max_length, stop, **generation_kwargs)
        B, P = context.shape
        prompts = [row[P - n :] for row, n in zip(context.tolist(), lengths)]
        budget = max_length - P
        pad = self.tokenizer.pad_token_id or 0
        with torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                            enabled=self.mixed_precision_dtype is not None):
            batch = generate(self.model, prompts, [budget] * B, [stop_ids(self.model, self.tokenizer)] * B,
                             finished=stop_strings(self.tokenizer, stop), pad_id=pad)
        if self._rows is not None:
            self._rows.kv_bytes.update({first + b: (r.kv_bytes, r.kv_bytes_full) for b, r in enumerate(batch.rows)
                                        if r.kv_bytes is not None})
        rows = [r.tokens + ([r.stop_token] if r.stop_token is not None else []) for r in batch.rows]
        width = max(map(len, rows))
        new = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=context.dtype, device=context.device)
        return torch.cat([context, new.view(B, width)], dim=1)


def left_aligned(model: torch.nn.Module, inps: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Logits ``[B, P, V]`` of the right-padded ``inps [B, P]`` (row i holds ``lengths[i]`` tokens, then padding),
    computed with every row moved to the right end (`LeftPadded`: left padding, a 2-D attention mask, positions from 0
    at each row's first token) and moved back: row i's logits ``[:lengths[i]]`` are its own; the rest are
    padding's."""
    batch = LeftPadded.from_right_padded(inps, lengths)
    logits = model(input_ids=batch.ids, attention_mask=batch.mask, position_ids=batch.positions).logits
    return batch.to_right_padded(logits)


def stop_strings(tokenizer: Any, stop: list[str]) -> Callable[[int, list[int]], bool]:
    """Whether a row's generated tokens end its generation: one of ``stop`` appears in the text of its last tokens,
    each string looked for in as many tokens as it encodes to plus two, as lm-eval's `MultiTokenEOSCriteria` looks
    (a string a tokenizer splits otherwise than the model wrote it is still found)."""
    lookback = {text: len(tokenizer.encode(text, add_special_tokens=False)) + 2 for text in stop}

    def finished(_: int, tokens: list[int]) -> bool:
        return any(text in tokenizer.decode(tokens[-n:]) for text, n in lookback.items())

    return finished


# ---- per-request sparsity ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class _RowLog:
    """The rows the model ran for one group of requests since the handle's reset, in order: row i is sample i of
    ``handle.stats()["per_sample"]``."""

    tokens: list[int] = dataclasses.field(default_factory=list)  # prompt tokens of each row
    padded: list[int] | None = None  # true lengths of the rows of the batch lm-eval just right-padded, until run
    fresh: deque[int] = dataclasses.field(default_factory=deque)  # request rows no result has claimed yet
    results: list[int] = dataclasses.field(default_factory=list)  # each result's row, results in lm-eval's order
    windows: list[int] = dataclasses.field(default_factory=list)  # windows of each rolling document, in order
    # a generated row → the bytes of keys and values its packed cache kept when it finished, and a full cache's
    kv_bytes: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def add(self, lengths: list[int], requests: bool = True) -> None:
        """Note one forward's rows (``lengths``: tokens of each); ``requests=False``: no request's result comes
        from them."""
        start = len(self.tokens)
        self.tokens.extend(lengths)
        if requests:
            self.fresh.extend(range(start, len(self.tokens)))

    def take_padded(self) -> list[int] | None:
        """The true row lengths of the batch lm-eval right-padded last (None: it padded none since the last call)."""
        lengths, self.padded = self.padded, None
        return lengths

    def of_requests(self, count: int, samples: int) -> list[list[int]]:
        """The rows of each of the ``count`` requests of the group (a rolling document's windows, else one row), in
        request order; ``samples``: how many the handle recorded.

        Raises:
            RuntimeError: the rows noted do not map onto the handle's samples or the requests.
        """
        sizes = self.windows or [1] * count
        if len(self.tokens) != samples or self.fresh or len(sizes) != count or sum(sizes) != len(self.results):
            raise RuntimeError(
                f"lm-eval's batches do not map onto the method's samples ({len(self.tokens)} rows run, {samples} "
                f"samples recorded, {len(self.fresh)} rows unclaimed, {len(self.results)} results of {count} "
                "requests): this lm-eval version batches requests in a way the bridge does not know")
        bounds = list(itertools.accumulate(sizes, initial=0))
        return [self.results[start:end] for start, end in itertools.pairwise(bounds)]


class _RowCollator(Collator):
    """lm-eval's `Collator` that also tells ``rows`` which row each result came from.

    lm-eval's batch loops run a batch's rows, then take their results in row order: a loglikelihood row through
    `get_cache`, which yields every request the row answers; a generated row directly. `get_original` puts the rows,
    like the results, back in request order (appended to ``rows.results``).
    """

    def __init__(self, arr: list, *args: Any, rows: _RowLog, **kwargs: Any):
        super().__init__(arr, *args, **kwargs)
        self._log, self._claimed = rows, []

    def get_cache(self, *args: Any, **kwargs: Any) -> Iterator:
        row = self._log.fresh.popleft()
        for answered in super().get_cache(*args, **kwargs):
            self._claimed.append(row)
            yield answered

    def get_original(self, newarr: list) -> list:
        while len(self._claimed) < len(newarr):  # results not taken through get_cache: one per row, in row order
            self._claimed.append(self._log.fresh.popleft())
        self._log.results.extend(super().get_original(self._claimed))
        return super().get_original(newarr)


def combined(samples: list[dict[str, float]], tokens: list[int]) -> dict[str, Any] | None:
    """One request's sparsity from the per-sample statistics of the rows that computed it (``samples``, from
    ``handle.stats()["per_sample"]``, and ``tokens``: each row's prompt tokens): a rolling document's windows, else
    one row, whose values are the request's.

    Windows are weighted as if they were one sample: ΩMSR by each window's tokens (the share of (token, layer, head)
    triples on a sparse head), ΩESR by each window's causal pairs ``t(t+1)/2`` (the share of the document's causal
    pairs skipped). Returns ``{"omega_msr", "omega_esr", "tokens"}`` (``tokens``: the tokens its rows ran, summed
    over windows, which overlap), or None for a request no row computed (an empty document).
    """
    if not samples:
        return None
    pairs = [causal_pairs(t, t) for t in tokens]
    return {
        "omega_msr": sum(t * s["omega_msr"] for t, s in zip(tokens, samples)) / sum(tokens),
        "omega_esr": sum(p * s["omega_esr"] for p, s in zip(pairs, samples)) / sum(pairs),
        "tokens": sum(tokens),
    }


def request_key(args: tuple) -> str:
    """A request's identity by content: the SHA-256 of its arguments (an `Instance`'s ``args``, a logged sample's
    ``arguments`` entry) as JSON."""
    return hashlib.sha256(json.dumps(args, sort_keys=True, default=str, ensure_ascii=False).encode()).hexdigest()


# ---- model arguments ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    """What `ElasticLM` loads, every argument checked (`plan_model`).

    Attributes:
        method: the method, its knobs set.
        source: the model spec resolved (`elastic_bench.modeling.loading.resolve_model`), its config read.
        dtype: the weights dtype; None: the loader's default.
        device: the device asked for, or the fallback where this machine lacks it (``fell_back``).
        tp: ranks per model under ``torchrun`` (1: the whole model in each process).
        fell_back: whether the device asked for is missing here and ``device`` is CUDA when present, else the CPU.
    """

    method: Method
    source: ModelSource
    dtype: torch.dtype | None
    device: torch.device
    tp: int
    fell_back: bool = False


def plan_model(pretrained: Any, method: str, kernel_backend: str, dtype: str | torch.dtype | None,
               device: str | None, tp: int | str, kwargs: dict[str, Any]) -> ModelPlan:
    """Check `ElasticLM`'s arguments without loading any weights (the arguments as `ElasticLM` takes them; the
    ``method_<knob>`` entries of ``kwargs`` are removed from it): the names, the method's knobs, ``tp``, ``dtype``,
    ``device``, ``kernel_backend`` on that device, and the model spec, whose config is read (a path that names
    nothing, a hub model neither reachable nor cached, heads that ``tp`` does not divide are refused here).

    Raises:
        ValueError, FileNotFoundError: what is wrong, in one line.
    """
    built = build_method(method, kwargs)
    for name in ("parallelize", "tp_plan"):
        if kwargs.get(name):
            raise ValueError(f"{name} places lm-eval's own hf model; the elastic model is sharded by tp=N under "
                             "torchrun")
    ranks = _tp(tp)
    world = torchrun_world_size()
    if ranks > 1 and world == 1:
        raise ValueError(f"tp={ranks} needs torchrun: torchrun --nproc-per-node {ranks} -m elastic_bench lm-eval run "
                         f"--model elastic --model_args ...,tp={ranks} ...")
    if ranks > 1 and str(kwargs.get("batch_size", "")).startswith("auto"):
        raise ValueError("batch_size auto probes memory on one rank; give a number with tp")
    weights, (placed, fell_back) = _dtype(dtype), _device(device)
    check_backend(kernel_backend, placed)
    source = resolve_model(str(pretrained))
    check_placement(source, ranks, None, world)
    source.config  # noqa: B018  (read now: a config that cannot be read is refused before the weights load)
    return ModelPlan(built, source, weights, placed, ranks, fell_back)


def check_model_args(args: dict[str, Any]) -> ModelPlan:
    """`plan_model` of ``ElasticLM(**args)`` (``args`` as lm-eval passes them: ``--model_args`` with its
    ``batch_size``, ``max_batch_size`` and ``device``); ``args`` is left as it is."""
    bound = inspect.signature(ElasticLM.__init__).bind(None, **args)
    bound.apply_defaults()
    values = {name: value for name, value in bound.arguments.items() if name != "self"}
    return plan_model(**{**values, "kwargs": dict(values["kwargs"])})


def _rank_device(plan: ModelPlan) -> torch.device:
    """The device this process loads on: the plan's, or under tensor parallelism the one of its ``LOCAL_RANK``
    (joining torchrun's process group, as ``run --tp`` does)."""
    if plan.tp == 1:
        return plan.device
    return torch.device(Ranks.from_env(plan.device.type, plan.tp).device(plan.device.type))


def _tp(value: int | str) -> int:
    """``tp`` as a whole number (lm-eval gives ``tp=2`` as the int 2; Python callers may give ``"2"``).

    Raises:
        ValueError: not a whole number (one line; its range is `elastic_bench.modeling.loading.check_placement`'s).
    """
    if isinstance(value, bool) or not str(value).strip().lstrip("-").isdigit():
        raise ValueError(f"tp must be a whole number of ranks (1, 2, 4, ...), got {value!r}")
    return int(value)


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
            error = did_you_mean("model argument", key, valid, every=True)
            raise type(error)(f"--model_args of `elastic` (method {name!r}): {error}")
    values = {key.removeprefix("method_"): kwargs.pop(key) for key in list(kwargs) if key.startswith("method_")}
    return get_method(name, **{knob: typed(cls, knob, value) for knob, value in values.items()})


def typed(cls: type, knob: str, value: Any) -> Any:
    """``value`` as the type of field ``knob`` of the method dataclass ``cls`` wants it: a string is read as the knob's
    flag reads its text (`CommandLineText`); a value lm-eval already converted from its text (it reads ``-1`` as
    -1.0 and ``true`` as True) is taken as it is where it fits, else read again from its text."""
    where = f"method_{knob}"
    if isinstance(value, str):
        return check_value(cls, knob, CommandLineText(value), where)
    try:
        return check_value(cls, knob, value, where)
    except ValueError as err:
        texts = [str(int(value))] if isinstance(value, float) and value.is_integer() else []
        for text in [*texts, str(value)]:
            with contextlib.suppress(ValueError):
                return check_value(cls, knob, CommandLineText(text), where)
        raise err from None


def _device(spec: str | None) -> tuple[torch.device, bool]:
    """The device ``spec`` names, and whether it fell back: as lm-eval's ``hf``, one this machine lacks (lm-eval's
    command-line default ``cuda:0`` on a CPU machine, say) or None gives CUDA when available, else the CPU.

    Raises:
        ValueError: ``spec`` is not a device name (one line).
    """
    try:
        requested = None if spec is None else torch.device(spec)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be cpu, cuda or cuda:N (e.g. cuda:0), got {spec!r}") from None
    try:
        return check_device(requested), False
    except ValueError:
        return check_device(None), spec is not None


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


class _LmEvalPatch:
    """The one patch of lm-eval's internals the bridge needs, held while an elastic model is open (`ElasticLM`, from
    its construction to `ElasticLM.close`) and while `cli` runs lm-eval (`held`); lm-eval's own attributes are put
    back when the last holder lets go. Importing the bridge changes no lm-eval attribute: it only adds ``elastic`` to
    lm-eval's model registry (``register_model``, its public extension point).

    lm-eval 0.4.13 offers no hook for what the bridge records, so each attribute below is replaced; each replacement
    does what lm-eval's own does unless an elastic model is running a group of requests (``rows``), an elastic
    model's results are handled, or ``cli``'s parsed command line is read again (``read``):

    - ``lm_eval.models.huggingface.pad_and_concat``: `HFLM._loglikelihood_tokens` right-pads a batch and calls
      ``_model_call(inps)`` with no attention mask and no row lengths; the replacement notes the true lengths
      (`_RowLog.padded`), so that `ElasticLM._model_call` runs each row on its own tokens.
    - ``lm_eval.models.huggingface.Collator``: `HFLM` reorders, batches and shares rows between requests inside one
      method through this module name; the replacement (`_RowCollator`) tells which row each result came from.
    - ``lm_eval.evaluator.evaluate``: the sample dicts of ``--log_samples`` are built inside ``evaluate`` from the
      requests' arguments and responses, with no field a model can add (the limitation behind
      EleutherAI/lm-evaluation-harness#603); the replacement adds each request's sparsity
      (`ElasticLM.add_sample_sparsity`).
    - ``lm_eval.loggers.EvaluationTracker.save_results_aggregated``: lm-eval's command line makes its tracker itself
      and gives models no output hook; the replacement also writes ``sparsity_<date>.json`` (`sparsity_path`).
    - ``lm_eval.config.evaluate_config.EvaluatorConfig.from_cli`` and ``process_tasks``: lm-eval's ``run`` command
      reads its configuration and task list from the parsed command line again; for `cli`'s own command line the
      replacements return what `cli` already read and checked (the task list takes seconds to index).

    Attributes:
        rows: the rows of the group of requests an elastic model is running now (`ElasticLM._logging_rows`), or None.
        read: ``(namespace, configuration, task manager)`` of the command line `cli` is running, or None.
        models: the elastic models open now (`cli` closes those its run opened).
    """

    def __init__(self):
        self.rows: _RowLog | None = None
        self.read: tuple[Any, Any, Any] | None = None
        self.models: weakref.WeakSet[ElasticLM] = weakref.WeakSet()
        self._holders = 0
        self._saved: list[tuple[Any, str, Any]] = []

    @contextlib.contextmanager
    def held(self, read: tuple[Any, Any, Any] | None = None) -> Iterator[None]:
        """lm-eval patched inside the block (``read``: `cli`'s command line, as `read` documents)."""
        if self._holders == 0:
            self._apply()
        self._holders += 1
        previous, self.read = self.read, read or self.read
        try:
            yield
        finally:
            self.read = previous
            self._holders -= 1
            if self._holders == 0:
                for owner, name, value in reversed(self._saved):
                    setattr(owner, name, value)
                self._saved = []

    def _apply(self) -> None:
        from lm_eval.config.evaluate_config import EvaluatorConfig

        pad_and_concat = huggingface.pad_and_concat
        evaluate, save = evaluator.evaluate, EvaluationTracker.save_results_aggregated
        from_cli, process_tasks = EvaluatorConfig.from_cli.__func__, EvaluatorConfig.process_tasks
        signature = inspect.signature(evaluate)

        def padding(max_length: int, tensors: list[torch.Tensor], padding_side: str = "right") -> torch.Tensor:
            if self.rows is not None and padding_side == "right":
                self.rows.padded = [t.shape[0] for t in tensors]
            return pad_and_concat(max_length, tensors, padding_side=padding_side)

        def collator(*args: Any, **kwargs: Any) -> Collator:
            return Collator(*args, **kwargs) if self.rows is None else _RowCollator(*args, rows=self.rows, **kwargs)

        @functools.wraps(evaluate)
        def evaluating(*args: Any, **kwargs: Any) -> dict | None:
            results = evaluate(*args, **kwargs)
            lm = signature.bind(*args, **kwargs).arguments["lm"]
            lm = lm.lm if isinstance(lm, CachingLM) else lm
            if isinstance(lm, ElasticLM) and results is not None and "samples" in results:
                lm.add_sample_sparsity(results["samples"])
            return results

        @functools.wraps(save)
        def saving(tracker: EvaluationTracker, results: dict, samples: dict | None = None) -> None:
            save(tracker, results=results, samples=samples)
            report = results.get("config", {}).get(REPORT_KEY)
            if report is not None and tracker.output_path:
                write_json(sparsity_path(tracker), report)

        def reading(cls: type, namespace: Any) -> Any:
            return self.read[1] if self.read and namespace is self.read[0] else from_cli(cls, namespace)

        def tasks(config: Any, metadata: dict | None = None) -> Any:
            return self.read[2] if self.read and config is self.read[1] else process_tasks(config, metadata)

        for owner, name, value in [(huggingface, "pad_and_concat", padding), (huggingface, "Collator", collator),
                                   (evaluator, "evaluate", evaluating),
                                   (EvaluationTracker, "save_results_aggregated", saving),
                                   (EvaluatorConfig, "from_cli", classmethod(reading)),
                                   (EvaluatorConfig, "process_tasks", tasks)]:
            self._saved.append((owner, name, inspect.getattr_static(owner, name)))
            setattr(owner, name, value)


LM_EVAL_PATCH = _LmEvalPatch()


# ---- the command line --------------------------------------------------------------------------------------------


def cli(argv: list[str]) -> int:
    """Run lm-eval's command line with the ``elastic`` model registered.

    Everything a user can get wrong is checked before lm-eval runs, with what lm-eval prints meanwhile held back
    (`_held_output`), so that it ends in one line (a ValueError): lm-eval's parser's errors (`_parser_error`), its
    configuration's and task list's, and the elastic model's arguments (`check_model_args`). lm-eval then runs on the
    configuration and tasks already read, holding `LM_EVAL_PATCH`; the elastic models it opened are closed when it
    ends.

    Raises:
        ValueError: a user error (one line).
    """
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    setup_logging()
    sys.argv = ["lm_eval", *argv]  # lm-eval's parser reads sys.argv (and inserts `run` where a command is missing)
    parser = HarnessCLI()
    with _held_output() as printed:
        try:
            args = parser.parse_args()
        except SystemExit as exit_:
            if exit_.code:
                raise ValueError(_parser_error(printed.getvalue(), parser, argv)) from None
            return 0  # its help was printed
        if args.command == "run":
            config, tasks = _checked_run(args)
    if args.command != "run":
        parser.execute(args)
        return 0
    with LM_EVAL_PATCH.held(read=(args, config, tasks)):
        before = set(LM_EVAL_PATCH.models)
        try:
            parser.execute(args)
        finally:
            for lm in set(LM_EVAL_PATCH.models) - before:  # lm-eval leaves the model it made open
                lm.close()
    return 0


def _checked_run(args: Any) -> tuple[Any, Any]:
    """lm-eval's configuration of ``lm-eval run`` (``args``: its parsed command line) and its task manager, the
    elastic model's arguments checked (`check_model_args`) before the tasks are looked up (the slower part).

    Raises:
        ValueError: a configuration lm-eval refuses, no task or one lm-eval does not know, an elastic model argument,
            or an argument given both in ``--model_args`` and as lm-eval's own flag (one line).
    """
    from lm_eval.config.evaluate_config import EvaluatorConfig

    try:
        config = EvaluatorConfig.from_cli(args)
    except TypeError as err:  # a --config file that is not a mapping of lm-eval's fields
        raise ValueError(f"lm-eval run: {err}") from None
    if not config.tasks:
        raise ValueError("lm-eval run needs --tasks (`elastic-bench lm-eval ls tasks` lists them)")
    if config.model == "elastic":
        flags = {key: getattr(config, key) for key in ("batch_size", "max_batch_size", "device")}
        for key, value in flags.items():
            if value is not None and key in config.model_args:  # lm-eval would pass it twice
                raise ValueError(f"{key} is lm-eval's --{key}: give it there, not in --model_args")
        check_model_args({**config.model_args, **{k: v for k, v in flags.items() if v is not None}})
    return config, config.process_tasks(config.metadata)


def _parser_error(printed: str, parser: Any, argv: list[str]) -> str:
    """The error argparse printed (its usage, then ``prog: error: message``) as one line: ``prog: message``; an
    unrecognized argument of an lm-eval command (``argv``'s first word, ``run`` when it names none) as the closest of
    that command's arguments, listing them all."""
    lines = [line for line in printed.splitlines() if line.strip()]
    message = lines[-1].replace(": error: ", ": ", 1) if lines else "lm-eval: invalid command line"
    _, unrecognized, given = message.partition(": unrecognized arguments: ")
    commands = parser._subparsers.choices  # lm-eval's `run`, `ls`, `validate`
    command = argv[0] if argv and argv[0] in commands else "run"
    if not unrecognized or not given.split():
        return message
    flags = sorted({o for a in commands[command]._actions for o in a.option_strings if o.startswith("--")})
    first = next((word for word in given.split() if word.startswith("-")), given.split()[0])
    return f"lm-eval {command}: {did_you_mean('argument', first, flags, every=True)}"


@contextlib.contextmanager
def _held_output() -> Iterator[io.StringIO]:
    """Inside the block, stdout and stderr (lm-eval's log handler's included) go to memory (the stderr buffer is
    yielded); written out when the block ends normally, dropped when it raises."""
    out, err = io.StringIO(), io.StringIO()
    handlers = [h for h in logging.getLogger("lm_eval").handlers if isinstance(h, logging.StreamHandler)]
    streams = [h.stream for h in handlers]
    try:
        for handler in handlers:  # swapped without `setStream`, which flushes the stream it replaces
            handler.stream = err
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield err
    finally:
        for handler, stream in zip(handlers, streams):
            handler.stream = stream
    sys.stdout.write(out.getvalue())
    sys.stderr.write(err.getvalue())
