"""Greedy generation with a timed one-shot prefill (time to first token), one prompt at a time, and the untimed
warm-up prefill that compiles a method's kernels before the first timed one."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from elastic_bench.modeling.fusion import fused_ops
from elastic_bench.modeling.kv_cache import PackedCache, cache_keyword, returned_cache


@dataclass
class Generation:
    """Generated tokens, the prefill's seconds, and the seconds of the ``decode_steps`` decode forwards after it."""

    tokens: list[int]
    prefill_seconds: float
    decode_seconds: float
    decode_steps: int


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _PrefillTimer:
    """Seconds of the prefill forward: CUDA events on the GPU (the device time between them), ``perf_counter`` after a
    synchronisation elsewhere."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))

    def __enter__(self):
        if self.cuda:
            self.events[0].record()
        else:
            self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.events[1].record()
            self.events[1].synchronize()
            self.seconds = self.events[0].elapsed_time(self.events[1]) / 1000
        else:
            self.seconds = time.perf_counter() - self.start


def _forward(model, ids: torch.Tensor, cache, **kwargs):
    """One cached forward → (last logits ``[B, V]``, the cache it returns); the cache is passed by keyword, so
    `elastic_bench.apply` may swap in its packed cache."""
    out = model(input_ids=ids, use_cache=True, **{cache_keyword(model): cache}, **kwargs)
    return out.logits[:, -1], returned_cache(out)


@torch.inference_mode()
def warm_up(model, input_ids: list[int], decode_graphs: bool = False) -> None:
    """One untimed prefill of ``input_ids`` and one decode step, exactly as `greedy_generate` runs them: the first
    call of a compiled kernel (Triton, FlexAttention) pays for compilation, which no timed step then includes. With
    ``decode_graphs`` the decode step runs the model's small operations compiled (`fused_ops`), as those of
    `greedy_generate` then do, so their compilation is paid here too."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    logits, cache = _forward(model, torch.tensor([input_ids], device=device), DynamicCache(), logits_to_keep=1)
    with fused_ops(model) if decode_graphs else contextlib.nullcontext():
        _forward(model, logits.argmax(-1)[:, None], cache)
    _sync(device)


class DecodeGraph:
    """One decode step of a batch-1 ``model`` over a `PackedCache`, captured as a CUDA graph and replayed.

    The step's inputs (token and position) live in static tensors; the cache's writes use device-side positions
    (`PackedLayer.newest`), so a replay repeats the step one position further. Capturing runs the step's Python once:
    the cache counts that step then, and `step` counts every later one on the host. The cache must have room for every
    step (`PackedCache.reserve`). Warm up with eager steps first (they compile the kernels), inside
    `elastic_bench.modeling.fusion.fused_ops` when the step should run the model's small operations fused.
    """

    def __init__(self, model, cache, position: int):
        device = next(model.parameters()).device
        self.cache = cache
        self.ids = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.positions = torch.full((1, 1), position, dtype=torch.long, device=device)
        self.graph = torch.cuda.CUDAGraph()
        self.pending = True  # the captured step is counted but not yet computed
        with torch.cuda.graph(self.graph):
            self.logits, _ = _forward(model, self.ids, cache, position_ids=self.positions)
            self.positions.add_(1)

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Logits ``[1, V]`` after ``token`` (``[1]``); the returned tensor is overwritten by the next step."""
        if not self.pending:
            self.cache.advance()
        self.pending = False
        self.ids.copy_(token.view(1, 1))
        self.graph.replay()
        return self.logits


@torch.inference_mode()
def greedy_generate(
    model, input_ids: list[int], max_new_tokens: int, stop_ids: set[int], min_new_tokens: int = 0,
    decode_graphs: bool = False,
) -> Generation:
    """Greedy decoding of one prompt.

    The prompt is prefilled in one forward (``logits_to_keep=1``), timed with CUDA events on the GPU (`_PrefillTimer`);
    decode steps reuse the KV cache the prefill returned (inside `elastic_bench.apply`, its packed cache). Generation
    stops at a token of ``stop_ids`` (not returned) once ``min_new_tokens`` tokens exist; before that, stop tokens are
    masked out. ``decode_graphs`` (CUDA, batch 1, a packed cache): the decode steps run the model's small operations
    compiled (`elastic_bench.modeling.fusion.fused_ops`), and after two eager decode steps the others replay one CUDA
    graph of
    the step (`DecodeGraph`).
    """
    from transformers import DynamicCache

    device = next(model.parameters()).device
    cache = DynamicCache()
    ids = torch.tensor([input_ids], device=device)
    stop = torch.tensor(sorted(stop_ids), device=device, dtype=torch.long)
    _sync(device)
    with _PrefillTimer(device) as timer:
        logits, cache = _forward(model, ids, cache, logits_to_keep=1)
    prefilled = time.perf_counter()
    tokens: list[int] = []
    steps = 0
    graph = None
    with fused_ops(model) if decode_graphs else contextlib.nullcontext():
        for step in range(max_new_tokens):
            if step < min_new_tokens and stop.numel():
                logits[:, stop] = float("-inf")
            token = logits.argmax(-1)
            if int(token) in stop_ids:
                break
            tokens.append(int(token))
            if step + 1 < max_new_tokens:
                if graph is not None:
                    logits = graph.step(token)
                elif decode_graphs and steps == 2 and isinstance(cache, PackedCache):
                    cache.reserve(max_new_tokens - step)
                    graph = DecodeGraph(model, cache, len(input_ids) + step)
                    logits = graph.step(token)
                else:
                    logits, cache = _forward(model, token[:, None], cache)
                steps += 1
    _sync(device)
    return Generation(tokens, timer.seconds, time.perf_counter() - prefilled, steps)
