"""Greedy generation of a left-padded batch of prompts, each decoded as it would be alone, with the prefill and the
decode steps timed; the untimed warm-up that compiles a method's kernels before the first timed prefill; and decode
steps replayed as CUDA graphs captured once per batch shape.

Design decisions:
- One loop for every batch size (`generate`; `greedy_generate` is its batch of one). Prompts are left-padded
  (`LeftPadded`) and prefilled in one forward with each row's positions counted from its first token and, where a row
  is padded, the 2-D padding mask: the attention glue plans every row on its own tokens and the packed cache drops
  the padding, so a row's tokens, sparsity and cache are those of its prompt alone.
- A row leaves the batch when it finishes (a stop token, its token budget, or the caller's `finished` test): what
  its cache rows hold is counted then (`PackedCache.sample_nbytes`), and transformers' ``batch_select_indices``
  drops it, so finished rows cost no decode work.
- The prefill and the decode steps of a batch are two spans of one `DeviceTimer` (CUDA events on the GPU).
- Decode graphs (`DecodeGraphs`, CUDA, a packed cache): each prompt is prefilled alone (a prefill is compute-bound, so
  a batch would not make it faster, and alone it needs neither padding nor a batch's activations) and its packed cache
  is copied into a static packed cache kept per batch shape (every row at a fixed place with room for the longest
  prompt and answer, `PackedCache(row_slots=..., rows=...)`), so the graph of the step captured over one batch reads
  the next batch of that shape at the same addresses. A shape runs two eager steps (they compile the kernels), then
  its graph is captured once and replayed by every later batch of that shape; a batch with fewer prompts than its
  shape (a cell's last) leaves the other rows empty. A batch keeps its shape until its last row finishes: finished
  rows ride along, since a replayed step costs nearly the same for any number of rows and a new shape needs a new
  graph. Rows named ``timed`` are prefilled with nothing else pending and timed on their own: a prefill time of batch
  1 within a batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from elastic_bench.kernels.timing import DeviceTimer
from elastic_bench.modeling.fusion import fused_ops
from elastic_bench.modeling.kv_cache import PackedCache, cache_keyword, returned_cache

EAGER_STEPS = 2  # decode steps a batch shape runs eagerly (compiling its kernels) before its graph is captured


@dataclass
class LeftPadded:
    """Token rows aligned at the right end of one ``[B, P]`` batch, the way the attention glue takes a batch.

    Attributes:
        ids: ``[B, P]`` token ids, row ``i``'s ``lengths[i]`` tokens last, padding before them.
        lengths: ``[B]`` tokens of each row.
    """

    ids: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def of(cls, rows: list[list[int]], pad_id: int = 0, device: torch.device | str = "cpu") -> LeftPadded:
        """The batch of ``rows`` (token lists), padded with ``pad_id``."""
        width = max(map(len, rows))
        ids = torch.tensor([[pad_id] * (width - len(r)) + list(r) for r in rows], dtype=torch.long, device=device)
        return cls(ids, torch.tensor([len(r) for r in rows], device=device))

    @classmethod
    def from_right_padded(cls, ids: torch.Tensor, lengths: torch.Tensor) -> LeftPadded:
        """The batch of the right-padded ``ids [B, P]`` (row ``i``: ``lengths[i]`` tokens, then padding), each row
        rotated to the right end."""
        return cls(ids.gather(1, (cls._steps(ids) - cls._shift(ids, lengths)) % ids.shape[1]), lengths)

    @staticmethod
    def _steps(ids: torch.Tensor) -> torch.Tensor:
        return torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)

    @staticmethod
    def _shift(ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return (ids.shape[1] - lengths.to(ids.device))[:, None]  # [B, 1] padding of each row

    @property
    def padded(self) -> bool:
        """Whether any row is shorter than the batch."""
        return bool((self.lengths < self.ids.shape[1]).any())

    @property
    def mask(self) -> torch.Tensor:
        """``[B, P]`` int64 attention mask: 1 on each row's tokens, 0 on its padding."""
        return (self._steps(self.ids) >= self._shift(self.ids, self.lengths)).long()

    @property
    def positions(self) -> torch.Tensor:
        """``[B, P]`` position of each token within its row (0 at the row's first token; padding 0)."""
        return (self._steps(self.ids) - self._shift(self.ids, self.lengths)).clamp(min=0)

    def to_right_padded(self, values: torch.Tensor) -> torch.Tensor:
        """``values [B, P, ...]`` of this batch's tokens moved back to the right-padded order of
        `from_right_padded` (row ``i``'s values for its tokens first)."""
        back = (self._steps(self.ids) + self._shift(self.ids, self.lengths)) % self.ids.shape[1]
        return values.gather(1, back.view(*back.shape, *[1] * (values.dim() - 2)).expand_as(values))


@dataclass
class Row:
    """One prompt's generation in a batch: its ``tokens`` (the stop token excluded), the stop token that ended it
    (None: its budget or the caller's test did), the bytes its rows of a packed cache held when it finished, beside
    those of a `DynamicCache` (None without a packed cache), and its prefill's seconds where it was timed alone."""

    tokens: list[int]
    stop_token: int | None = None
    kv_bytes: int | None = None
    kv_bytes_full: int | None = None
    prefill_seconds: float | None = None


@dataclass
class Batch:
    """The rows of a batch (in prompt order), the batch's prefill seconds, and the seconds of its ``decode_steps``
    decode forwards (each one token for every row still running)."""

    rows: list[Row]
    prefill_seconds: float
    decode_seconds: float
    decode_steps: int


@dataclass
class Generation:
    """Generated tokens, the prefill's seconds, the seconds of the ``decode_steps`` decode forwards after it, and the
    bytes the packed cache held when generation ended beside those of a `DynamicCache` (None without a packed
    cache)."""

    tokens: list[int]
    prefill_seconds: float
    decode_seconds: float
    decode_steps: int
    kv_bytes: int | None = None
    kv_bytes_full: int | None = None


def stop_ids(model, tokenizer) -> set[int]:
    """The model's end-of-sequence ids (its generation config's) and the tokenizer's."""
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def empty_cache(model):
    """The empty cache a generation starts with: transformers' `DynamicCache` made from the model's config, so a
    hybrid model's linear-attention layers get their recurrent-state layers (inside `elastic_bench.apply`, a
    `PackedCache` made like it takes its place)."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def _forward(model, ids: torch.Tensor, cache, **kwargs):
    """One cached forward → (last logits ``[B, V]``, the cache it returns); the cache is passed by keyword, so
    `elastic_bench.apply` may swap in its packed cache."""
    out = model(input_ids=ids, use_cache=True, **{cache_keyword(model): cache}, **kwargs)
    return out.logits[:, -1], returned_cache(out)


class DecodeGraph:
    """One decode step of a batch of ``rows`` over a `PackedCache`, captured as a CUDA graph and replayed.

    The step's inputs (tokens and positions, ``[rows, 1]``) live in static tensors; the cache's writes use device-side
    positions (`PackedLayer.newest`), so a replay repeats the step one position further. Capturing runs the step's
    Python once: the cache counts that step then, and `step` counts every later one on the host. The cache's storage
    must not move while the graph is used: a static cache (`PackedCache` with ``row_slots``), or room for every step
    (`PackedCache.reserve`). Warm up with eager steps first (they compile the kernels), inside
    `elastic_bench.modeling.fusion.fused_ops` when the step should run the model's small operations fused.

    Args:
        position: the position of the first token `step` will take: an int (every row) or ``[rows]``.
    """

    def __init__(self, model, cache, position: int | torch.Tensor, rows: int = 1):
        device = next(model.parameters()).device
        self.cache = cache
        self.ids = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.restart(position)
        self.graph = torch.cuda.CUDAGraph()
        self.pending = True  # the captured step is counted but not yet computed
        with torch.cuda.graph(self.graph):
            self.logits, _ = _forward(model, self.ids, cache, position_ids=self.positions)
            self.positions.add_(1)

    def restart(self, position: int | torch.Tensor) -> None:
        """Continue at ``position`` (an int or ``[rows]``): a new batch prefilled into the same cache."""
        position = torch.as_tensor(position, device=self.positions.device)
        self.positions.copy_(position.view(-1, 1).expand_as(self.positions))

    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Logits ``[rows, V]`` after ``token`` (``[rows]``); the returned tensor is overwritten by the next step."""
        if not self.pending:
            self.cache.advance()
        self.pending = False
        self.ids.copy_(token.view(-1, 1))
        self.graph.replay()
        return self.logits


class DecodeGraphs:
    """The decode graphs of a sequence of batches (a cell of a run): per batch shape a static `PackedCache` and one
    graph of the step over it, captured once.

    Args:
        row_slots: slots of every cache row (the longest prompt plus the longest answer the batches will have); a
            batch that needs more gets a larger cache, whose graph is captured anew.
        capture: makes the graph of a shape, ``capture(model, cache, positions, rows)`` → an object with
            ``step(tokens) -> logits`` and ``restart(positions)`` (default `DecodeGraph`; a test may count or replace
            it).

    Attributes:
        captured: the shapes ``(rows, row_slots)`` captured so far, in order.
    """

    def __init__(self, row_slots: int = 0, capture: Callable[..., DecodeGraph] = DecodeGraph):
        self.row_slots, self.capture = row_slots, capture
        self.caches: dict[int, PackedCache] = {}  # rows → the static cache of that batch shape
        self.graphs: dict[tuple[int, int], DecodeGraph] = {}
        self.eager: dict[tuple[int, int], int] = {}  # shape → eager steps run before its capture
        self.captured: list[tuple[int, int]] = []

    def cache(self, rows: int, slots: int) -> PackedCache:
        """The static cache of a batch of ``rows`` rows that need ``slots`` slots each, emptied for a new batch."""
        cache = self.caches.get(rows)
        if cache is None or cache.row_slots < slots:
            if cache is not None:  # its graph goes with it
                self.graphs.pop((rows, cache.row_slots), None)
                del self.caches[rows], cache  # released before the larger one is allocated
            cache = self.caches[rows] = PackedCache(row_slots=max(slots, self.row_slots), rows=rows)
        cache.reset()
        return cache

    def drop(self, rows: int) -> None:
        """Forget the cache and the graph of batches of ``rows`` rows (a batch of that shape ran out of memory)."""
        cache = self.caches.pop(rows, None)
        if cache is not None:
            self.graphs.pop((rows, cache.row_slots), None)

    def step(self, model, cache: PackedCache, tokens: torch.Tensor, positions: torch.Tensor, first: bool):
        """Logits ``[rows, V]`` after ``tokens`` (``[rows]``, at ``positions [rows]``) over ``cache`` (from `cache`):
        an eager step while the shape is warming, else the shape's graph (captured now if it is due); ``first``: the
        first decode step of a batch."""
        shape = (tokens.shape[0], cache.row_slots)
        graph = self.graphs.get(shape)
        if graph is None and self.eager.get(shape, 0) < EAGER_STEPS:
            self.eager[shape] = self.eager.get(shape, 0) + 1
            return _forward(model, tokens[:, None], cache, position_ids=positions[:, None])[0]
        if graph is None:
            graph = self.graphs[shape] = self.capture(model, cache, positions, tokens.shape[0])
            self.captured.append(shape)
        elif first:
            graph.restart(positions)
        return graph.step(tokens)


@torch.inference_mode()
def generate(
    model, prompts: list[list[int]], max_new_tokens: list[int], stop_ids: list[set[int]],
    min_new_tokens: list[int] | None = None, finished: Callable[[int, list[int]], bool] | None = None,
    decode_graphs: bool | DecodeGraphs = False, pad_id: int = 0, timed: list[bool] | None = None,
    rows: int | None = None,
) -> Batch:
    """Greedy decoding of a batch of prompts, each as it would be decoded alone.

    The prompts are prefilled (``logits_to_keep=1``) in one forward as a left-padded batch, or with ``decode_graphs``
    one at a time into the shape's static cache; decode steps reuse the KV cache the prefill returned (inside
    `elastic_bench.apply`, its packed cache). Row ``i`` stops at a token of ``stop_ids[i]`` (not returned) once
    ``min_new_tokens[i]`` tokens exist (before that, stop tokens are masked out), after ``max_new_tokens[i]`` tokens,
    or when ``finished(i, tokens)`` says so after a token; then it leaves the batch. ``decode_graphs`` (CUDA, a packed
    cache): the decode steps run the model's small operations compiled (`elastic_bench.modeling.fusion.fused_ops`)
    and replay a graph of the step (`DecodeGraphs`; True: graphs of this call alone).

    Args:
        prompts: token ids of each prompt (``B`` lists).
        max_new_tokens, stop_ids, min_new_tokens: of each prompt.
        finished: ``finished(i, tokens)``: whether prompt ``i`` is done with the ``tokens`` it has (e.g. a stop
            string); None: stop tokens and budgets only.
        pad_id: the token left padding holds (never attended).
        timed: with ``decode_graphs``, the prompts whose prefill runs with nothing else pending and is timed alone
            (`Row.prefill_seconds`).
        rows: with ``decode_graphs``, the batch shape (at least ``B``; default ``B``): its graph decodes the batch,
            the rows past ``B`` empty.

    Returns:
        A `Batch`: each prompt's tokens and cache bytes, the batch's prefill and decode seconds.
    """

    device = next(model.parameters()).device
    graphs = DecodeGraphs() if decode_graphs is True else decode_graphs or None
    B = len(prompts)
    if not graphs and (timed or rows):
        raise ValueError("timed rows and a batch shape are for decode graphs")
    budget = max(max_new_tokens)
    stops = [torch.tensor(sorted(s), dtype=torch.long, device=device) for s in stop_ids]
    least = min_new_tokens or [0] * B
    timer = DeviceTimer(device)
    rows_out = [Row([]) for _ in prompts]
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    if graphs:
        shape = rows or B
        cache = graphs.cache(shape, max(map(len, prompts)) + budget)
        with timer.span():
            logits = torch.cat([_prefill_alone(model, prompt, cache, rows_out[b], timed is not None and timed[b])
                                for b, prompt in enumerate(prompts)])
        mask = None
    else:
        batch = LeftPadded.of(prompts, pad_id, device)
        padding = {"attention_mask": batch.mask, "position_ids": batch.positions} if batch.padded else {}
        with timer.span():
            logits, cache = _forward(model, batch.ids, empty_cache(model), logits_to_keep=1, **padding)
        mask = padding.get("attention_mask")  # attended at decode by a cache that keeps the padding (not a packed one)
    packed = isinstance(cache, PackedCache)
    live = list(range(B))  # the prompt of each row of the running batch
    running = [n > 0 for n in max_new_tokens]  # whether each row still generates (with graphs, finished rows stay)
    steps = 0
    with timer.span(), (fused_ops(model) if graphs else contextlib.nullcontext()):
        for step in range(budget):
            for i, prompt in enumerate(live):
                if running[i] and step < least[prompt] and stops[prompt].numel():
                    logits[i, stops[prompt]] = float("-inf")
            tokens = logits.argmax(-1)
            for i, (prompt, token) in enumerate(zip(live, tokens.tolist())):
                if running[i]:
                    running[i] = _take(rows_out[prompt], token, stop_ids[prompt], max_new_tokens[prompt], finished,
                                       prompt)
                    if not running[i] and packed:
                        rows_out[prompt].kv_bytes, rows_out[prompt].kv_bytes_full = cache.sample_nbytes(i)
            if not any(running):
                break
            if graphs:  # the batch keeps its shape; finished rows and empty ones ride along
                empty = shape - B
                logits = graphs.step(model, cache, torch.nn.functional.pad(tokens, (0, empty)),
                                     torch.nn.functional.pad(lengths + step, (0, empty)), first=step == 0)[:B]
            else:
                if not all(running):
                    keep = [i for i, on in enumerate(running) if on]
                    index = torch.tensor(keep, device=device)
                    cache.batch_select_indices(index)
                    tokens, lengths = tokens[index], lengths[index]
                    mask = mask[index] if mask is not None else None
                    live, running = [live[i] for i in keep], [True] * len(keep)
                kwargs = {}
                if mask is not None and not packed:
                    mask = kwargs["attention_mask"] = torch.cat([mask, mask.new_ones(len(live), 1)], 1)
                logits, cache = _forward(model, tokens[:, None], cache, position_ids=(lengths + step)[:, None],
                                         **kwargs)
            steps += 1
    prefill_seconds, decode_seconds = timer.elapsed()
    return Batch(rows_out, prefill_seconds, decode_seconds, steps)


def _prefill_alone(model, prompt: list[int], cache: PackedCache, row: Row, timed: bool) -> torch.Tensor:
    """Prefill ``prompt`` alone and add its packed cache to the static ``cache``; its last logits ``[1, V]``. ``timed``:
    with nothing else pending, its seconds in ``row.prefill_seconds``."""

    device = next(model.parameters()).device
    timer = DeviceTimer(device)
    if timed and device.type == "cuda":
        torch.cuda.synchronize(device)
    with timer.span() if timed else contextlib.nullcontext():
        logits, alone = _forward(model, torch.tensor([prompt], device=device), empty_cache(model), logits_to_keep=1)
    if not isinstance(alone, PackedCache):
        raise ValueError("decode graphs need a packed KV cache: generate inside elastic_bench.apply, kv_cache "
                         "'evicting' or 'full'")
    if timed:
        (row.prefill_seconds,) = timer.elapsed()
    cache.add_sample(alone)
    return logits


def _take(row: Row, token: int, stop_ids: set[int], max_new_tokens: int, finished, prompt: int) -> bool:
    """Add ``token`` to ``row`` (or end it on a stop token); whether the row goes on."""
    if token in stop_ids:
        row.stop_token = token
        return False
    row.tokens.append(token)
    return len(row.tokens) < max_new_tokens and not (finished is not None and finished(prompt, row.tokens))


def greedy_generate(
    model, input_ids: list[int], max_new_tokens: int, stop_ids: set[int], min_new_tokens: int = 0,
    decode_graphs: bool | DecodeGraphs = False,
) -> Generation:
    """Greedy decoding of one prompt: `generate` of a batch of one, its prefill timed alone."""
    batch = generate(model, [input_ids], [max_new_tokens], [stop_ids], [min_new_tokens], decode_graphs=decode_graphs,
                     timed=[True] if decode_graphs else None)
    (row,) = batch.rows
    prefill = row.prefill_seconds if row.prefill_seconds is not None else batch.prefill_seconds
    return Generation(row.tokens, prefill, batch.decode_seconds, batch.decode_steps, row.kv_bytes, row.kv_bytes_full)


def warm_up(model, input_ids: list[int], decode_graphs: bool | DecodeGraphs = False, rows: int = 1) -> None:
    """An untimed prefill of ``input_ids`` and a decode step, exactly as `greedy_generate` runs them: the first call
    of a compiled kernel (Triton, FlexAttention) pays for compilation, which no timed step then includes. With
    ``decode_graphs`` the decode step runs the model's small operations compiled (`fused_ops`), as those of
    `greedy_generate` then do, so their compilation is paid here too; given `DecodeGraphs` (inside
    `elastic_bench.apply`), a batch of ``rows`` copies of the prompt decodes until the graph of that batch shape is
    captured and replayed, so no later batch of that shape captures one (a graph does not depend on the prompts'
    lengths: a short prompt warms the shape)."""
    if isinstance(decode_graphs, DecodeGraphs):
        steps = EAGER_STEPS + 2  # tokens: the prefill's, the eager steps', the captured step's and a replay's
        generate(model, [input_ids] * rows, [steps] * rows, [set()] * rows, [steps] * rows,
                 decode_graphs=decode_graphs)
    else:
        _warm_step(model, input_ids, decode_graphs)
    device = next(model.parameters()).device
    if device.type == "cuda":  # the warm-up's work is done before anything is timed
        torch.cuda.synchronize(device)


@torch.inference_mode()
def _warm_step(model, input_ids: list[int], fused: bool) -> None:
    """A prefill and one decode step (inside `fused_ops` when ``fused``)."""

    device = next(model.parameters()).device
    logits, cache = _forward(model, torch.tensor([input_ids], device=device), empty_cache(model), logits_to_keep=1)
    with fused_ops(model) if fused else contextlib.nullcontext():
        _forward(model, logits.argmax(-1)[:, None], cache)


def fitting_batch(model, prompt: list[int], most: int, decode_graphs: bool | DecodeGraphs = False) -> int:
    """The largest batch of ``prompt`` (at most ``most`` rows, halved from there) whose prefill and first decode step
    fit in the device's memory, with ``decode_graphs`` as `generate` takes it (a static cache holds more than a
    packed one, and its prompts are prefilled one at a time: the probe prefills once, copies that prompt into every
    row of a cache of its own, and prefills again beside them; the graphs' caches are not touched); 1 when even two
    do not fit (one's out-of-memory error then comes from the run itself)."""
    rows = most
    while rows > 1:
        try:
            if isinstance(decode_graphs, DecodeGraphs):
                _fill_static(model, prompt, rows, max(decode_graphs.row_slots, len(prompt) + 2))
            else:
                generate(model, [prompt] * rows, [2] * rows, [set()] * rows, [2] * rows)
            return rows
        except torch.cuda.OutOfMemoryError:
            pass
        torch.cuda.empty_cache()  # out of the except block, which held the failed try's tensors
        rows //= 2
    return 1


@torch.inference_mode()
def _fill_static(model, prompt: list[int], rows: int, row_slots: int) -> None:
    """A static cache of ``rows`` copies of ``prompt``'s packed cache (``row_slots`` slots per row), a prefill beside
    it and a decode step over it: the memory of a batch of that shape at its peak, all released on return."""

    device = next(model.parameters()).device
    cache = PackedCache(row_slots=row_slots, rows=rows)
    ids = torch.tensor([prompt], device=device)
    logits, alone = _forward(model, ids, empty_cache(model), logits_to_keep=1)
    for _ in range(rows):
        cache.add_sample(alone)
    del alone
    _forward(model, ids, empty_cache(model), logits_to_keep=1)
    _forward(model, logits.argmax(-1).expand(rows)[:, None], cache,
             position_ids=torch.full((rows, 1), len(prompt), device=device))
