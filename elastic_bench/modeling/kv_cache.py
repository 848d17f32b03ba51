"""The KV cache elastic-bench decodes with: a transformers `Cache` whose layers are packed after prefill, keeping for
each (sample, KV head) only what the method's decode steps will attend.

Design decisions:
- `PackedCache` is a transformers `Cache` of `PackedLayer` layers (each a `DynamicLayer` until packed), so
  ``generate`` and the harness's greedy loop take it unchanged; inside `elastic_bench.apply` it replaces the empty
  `DynamicCache` a generation starts with (``kv_cache=`` of `apply` chooses).
- A layer holds its prompt densely until the prefill attention of that layer has run; the glue then packs it
  (`PackedLayer.pack`) by the method's decode plan, so a long prompt never holds more than one dense layer beyond the
  packed ones. Rows are (sample, KV head) pairs, stored one after another (`elastic_bench.kernels.decode.PackedKV`):
  a FULL row keeps the sample's tokens (its left padding dropped) and room for ``GROW`` more; a STREAMING row of an
  evicting cache keeps ``sink_end`` sink slots and a ring of ``window_span`` slots, the newest token overwriting the
  oldest, so its storage never grows; without eviction it is kept whole and its window is applied by mask
  (upstream's behaviour).
- A decode step writes the new token into each row's slot (`elastic_bench.kernels.decode.append_token`, one call
  per layer, positions advanced on the device: no concatenation, no host synchronisation) and returns the new token's
  states; the attention glue reads the packed layer instead (`elastic_bench.kernels.decode.decode_attention`, one
  call per layer). When the kept rows' room is used up, the layer is reallocated with ``GROW`` more slots per kept
  row.
- A batch drops the samples that finished (`PackedLayer.batch_select_indices`, transformers' call): their rows leave
  the per-row vectors, so decode steps no longer compute them; their slots stay allocated until the next reallocation.
- ``kv_bytes`` and ``kv_bytes_full`` (`PackedLayer.sample_nbytes`) count the same thing on both sides, so their ratio is
  the fraction of the keys and values a method keeps: ``kv_bytes`` the keys and values of the tokens the sample's rows
  hold (a FULL row, or a STREAMING row kept whole, every token so far; a ring at most ``sink_end + window_span``),
  ``kv_bytes_full`` those of every token so far in every row (what a `DynamicCache` holds). The two are equal for a
  method that decodes densely, whatever room the rows have for later tokens; the storage itself (that room, the slot
  positions) is not counted. They are counted on the host, per sample, so a sample of a batch reports what it would
  hold alone.
- A static cache (``row_slots`` and ``rows``, for CUDA graphs replayed over batch after batch): ``rows`` samples of
  ``row_slots`` slots per row at fixed places, filled one sample at a time from a prompt packed alone
  (`PackedCache.add_sample`: a copy into the sample's rows), so every tensor a decode step reads (storage, per-row
  vectors) and the decode kernel's host integers keep their addresses from one batch to the next. Samples not added
  to a batch hold empty rows that ride along. The bytes counted are still the tokens the method keeps.
- Decode plans with BLOCK_SPARSE heads or a chunked geometry are refused when packing (no method decodes so).
- A layer the glue does not pack (an MLA layer, whose cache holds transformers' compressed latent; a layer with learned
  sinks) stays a dense `DynamicLayer` whose samples' tokens are counted (`PackedLayer.hold_dense`): its bytes kept
  equal a full cache's. In a model with layers of other kinds (linear attention's recurrent state), a `PackedCache`
  made ``like`` transformers' cache of the model keeps those layers as they are; they hold no keys nor values and
  are not counted.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer

from elastic_bench.kernels import HeadPlan, Mode
from elastic_bench.kernels.decode import AppendRule, PackedKV, append_token

GROW = 256  # decode tokens of room per kept row, added again whenever it runs out
KV_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer)  # transformers' key-value layers a `PackedLayer` stands for
CACHE_KEYWORDS = ("cache", "past_key_values")  # a forward's cache argument: transformers >= 5.24, and before


def cache_keyword(model) -> str:
    """The name under which ``model``'s forward takes its KV cache (``cache``, or ``past_key_values`` before
    transformers 5.24)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(output) -> Cache | None:
    """The KV cache a forward's output carries (``output.cache``, or ``output.past_key_values`` before 5.24; the old
    name is read only where the new one is absent, since reading it warns of its deprecation)."""
    return output["cache"] if "cache" in output else output.get("past_key_values")


def _offsets(caps: list[int]) -> torch.Tensor:
    """``[R]`` int64 first slot of each row of ``caps`` slots, on the CPU."""
    return torch.tensor([0, *caps[:-1]], dtype=torch.long).cumsum(0)


def _packed(keys, values, positions, offsets: torch.Tensor, caps: list[int], window_start, sink_end) -> PackedKV:
    """A `PackedKV` of rows with ``caps`` slots each; its host integers (the longest row, how many rows are long)
    come from ``caps``."""
    device = keys.device
    longest = max(caps)
    return PackedKV(keys, values, positions, offsets.to(device), torch.tensor(caps, dtype=torch.int32, device=device),
                    window_start, sink_end, longest, sum(c > longest // 2 for c in caps))


class PackedLayer(DynamicLayer):
    """One layer of a `PackedCache`: a `DynamicLayer` until `pack`, then packed rows (`packed`).

    Args:
        row_slots, rows: a static layer (`PackedCache`'s): ``rows`` samples whose rows have ``row_slots`` slots each,
            filled by `add_sample` into tensors allocated once.
    """

    def __init__(self, row_slots: int = 0, rows: int = 0):
        super().__init__()
        self.packed: PackedKV | None = None
        self.row_slots, self.rows = row_slots, rows
        self.ints: tuple | None = None  # a static layer's geometry: heads, width, dtype, ring and window integers
        self.lengths: list[int] = []  # each sample's prompt tokens (host), once packed, added or held dense
        self.caps: list[int] = []  # each row's slots (host)
        self.rings: list[bool] = []  # whether each row is a ring (host)
        self.dense = False  # held dense after its prefill (`hold_dense`)

    @property
    def settled(self) -> bool:
        """Whether the layer's prompt was packed or held dense (the glue packs a layer once)."""
        return self.packed is not None or self.dense

    def hold_dense(self, starts: list[int]) -> None:
        """Keep the dense prompt ``[B, H, L, D]`` as it is (a `DynamicLayer`), counting each sample's tokens from
        ``starts`` (its first real token) for `sample_nbytes`."""
        self.lengths = [self.keys.shape[2] - s for s in starts]
        self.steps, self.dense = 0, True

    # ---- packing -------------------------------------------------------------------------------------------------

    def pack(self, plan: HeadPlan, starts: list[int], evict: bool) -> None:
        """Pack the dense prompt ``[B, H, L, D]`` by the decode ``plan``.

        Args:
            plan: the method's decode plan of this layer (modes ``[B, H]``, FULL or STREAMING).
            starts: the first real token of each sample (left padding before it is dropped).
            evict: keep only sink + window of STREAMING rows (else keep them whole, masked at decode).
        """
        if self.row_slots:
            raise ValueError("a static packed cache takes its samples packed alone (PackedCache.add_sample)")
        modes = plan.modes.cpu()
        if bool((modes == Mode.BLOCK_SPARSE).any()):
            raise ValueError("a packed KV cache takes decode plans of FULL and STREAMING heads only")
        streaming = modes == Mode.STREAMING
        geometry = plan.streaming
        if geometry.chunk_starts and bool(streaming.any()):
            raise ValueError("a packed KV cache takes unchunked streaming geometries at decode")
        keys, values = self.keys, self.values
        B, H, L, D = keys.shape
        sink, span = geometry.sink_end(plan.block_size), geometry.window_span(plan.block_size)
        ring = streaming & evict
        lengths = [L - s for s in starts]
        caps = [sink + span if ring[b, h] else lengths[b] + GROW for b in range(B) for h in range(H)]
        offsets = _offsets(caps)
        total = sum(caps)
        dense_k = keys.new_zeros((total, D))
        dense_v = values.new_zeros((total, D))
        positions = torch.full((total,), -1, dtype=torch.int32, device=keys.device)
        for b in range(B):
            n = lengths[b]
            for h in range(H):
                r = b * H + h
                kept = torch.arange(n, device=keys.device)
                if ring[b, h]:
                    kept = torch.cat([kept[: min(sink, n)], kept[max(sink, n - span):]])
                    slots = torch.where(kept < sink, kept, sink + (kept - sink) % span)
                else:
                    slots = kept
                slots = slots + int(offsets[r])
                dense_k[slots] = keys[b, h, starts[b] + kept]
                dense_v[slots] = values[b, h, starts[b] + kept]
                positions[slots] = kept.int()
        device = keys.device
        self.tokens = L
        self.steps = 0  # decode tokens written (host); `newest` advances on the device, for CUDA-graph replays
        self.room = GROW
        self.heads = H
        self.lengths, self.caps, self.rings = lengths, caps, ring.reshape(-1).tolist()
        self.newest = torch.tensor(lengths, dtype=torch.int32, device=device).repeat_interleave(H) - 1  # [R]
        self.rule = AppendRule(ring.reshape(-1).to(device), streaming.reshape(-1).to(device), sink, span,
                               *geometry.window_steps(plan.block_size))
        window_start = torch.where(self.rule.streaming, geometry.window_start(self.newest, plan.block_size), 0).int()
        sink_end = torch.where(self.rule.streaming, sink, 0).int()
        self.packed = _packed(dense_k, dense_v, positions, offsets, caps, window_start, sink_end)
        self.keys = self.values = None  # the dense prompt is released

    def add_sample(self, source: PackedLayer) -> None:
        """Copy the packed rows of ``source`` (the same layer of one prompt packed alone) into this static layer as its
        next sample, in place: the storage and the per-row vectors keep their addresses."""
        kv, H = source.packed, source.heads
        if kv is None or len(source.lengths) != 1:
            raise ValueError("a static packed cache takes the packed layers of one prompt each")
        sample, S = len(self.lengths), self.row_slots
        if sample >= self.rows:
            raise ValueError(f"a static packed cache holds {self.rows} samples")
        if source.lengths[0] > S:
            raise ValueError(f"a static packed cache of {S} slots per row cannot hold a prompt of "
                             f"{source.lengths[0]} tokens")
        rule = source.rule
        ints = (H, kv.keys.shape[1], kv.keys.dtype, rule.ring_sink, rule.ring_span, rule.quantum, rule.back)
        if self.packed is None:
            self._allocate(kv, rule, H)
        elif self.ints != ints:
            raise ValueError(f"a static packed cache takes one layer geometry: {self.ints}, now {ints}")
        self.ints = ints
        kept = [min(c, S) for c in source.caps]  # slots past a row's prompt are empty
        src = torch.cat([torch.arange(o, o + n) for o, n in zip(kv.offsets.tolist(), kept)]).to(kv.keys.device)
        dst = torch.cat([torch.arange(r * S, r * S + n) for r, n in enumerate(kept, sample * H)]).to(kv.keys.device)
        mine, rows = self.packed, slice(sample * H, (sample + 1) * H)
        mine.keys[dst], mine.values[dst], mine.positions[dst] = kv.keys[src], kv.values[src], kv.positions[src]
        mine.window_start[rows], mine.sink_end[rows] = kv.window_start, kv.sink_end
        self.newest[rows] = source.newest
        self.rule.ring[rows], self.rule.streaming[rows] = rule.ring, rule.streaming
        self.lengths.append(source.lengths[0])
        self.caps += source.caps
        self.rings += source.rings
        self.tokens = max(self.lengths)

    def _allocate(self, kv: PackedKV, rule: AppendRule, heads: int) -> None:
        """The tensors of a static layer of ``heads`` KV heads, like ``kv``'s and ``rule``'s, every row empty."""
        R, S, device = self.rows * heads, self.row_slots, kv.keys.device
        self.heads, self.steps, self.room = heads, 0, GROW
        self.newest = torch.full((R,), -1, dtype=torch.int32, device=device)
        empty = torch.zeros(R, dtype=torch.bool, device=device)
        self.rule = dataclasses.replace(rule, ring=empty, streaming=empty.clone())
        self.packed = PackedKV(
            kv.keys.new_zeros((R * S, kv.keys.shape[1])), kv.values.new_zeros((R * S, kv.values.shape[1])),
            torch.full((R * S,), -1, dtype=torch.int32, device=device),
            torch.arange(R, dtype=torch.long, device=device) * S, torch.full((R,), S, dtype=torch.int32, device=device),
            torch.zeros(R, dtype=torch.int32, device=device), torch.zeros(R, dtype=torch.int32, device=device), S, R)

    # ---- decoding ------------------------------------------------------------------------------------------------

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Dense: transformers' `DynamicLayer.update`. Packed: write the new token (``[B, H, 1, D]``) into its slots
        and return its states (the glue attends the packed rows)."""
        if self.packed is None:
            if self.dense:
                self.steps += key_states.shape[2]
            return super().update(key_states, value_states, *args, **kwargs)
        if key_states.shape[2] != 1:
            raise NotImplementedError("a packed KV cache continues one token at a time; for a prefill fed in chunks "
                                      "by the caller use kv_cache='dynamic'")
        self.advance()
        rows = self.packed.num_rows
        append_token(self.packed, key_states.reshape(rows, -1), value_states.reshape(rows, -1), self.newest, self.rule)
        return key_states, value_states

    def advance(self) -> None:
        """Count one decode token on the host (`update` does; a CUDA-graph replay of a step does the device work); a
        kept row whose room is used up gets ``GROW`` more slots."""
        self.steps += 1
        self.tokens += 1
        if self.row_slots and max(self.lengths) + self.steps > self.row_slots:
            raise RuntimeError(f"a static packed cache of {self.row_slots} slots per row is full")
        if self.steps > self.room:
            self._grow(GROW)

    def reserve(self, tokens: int) -> None:
        """Room for ``tokens`` more decode tokens in every kept row, so no step reallocates (a CUDA graph needs the
        storage it was captured on); a static layer has its room already."""
        if self.packed is not None and not self.row_slots and self.steps + tokens > self.room:
            self._grow(self.steps + tokens - self.room)

    def _grow(self, extra: int) -> None:
        """Reallocate with ``extra`` more slots for every kept row (the rows of dropped samples are left behind); a
        static layer has room already and counts the slots only."""
        kv = self.packed
        old_caps = self.caps
        caps = [c if ring else c + extra for c, ring in zip(old_caps, self.rings)]
        self.room += extra
        if self.row_slots:
            self.caps = caps
            return
        offsets = _offsets(caps)
        total, width = sum(caps), kv.keys.shape[1]
        keys, values = kv.keys.new_zeros((total, width)), kv.values.new_zeros((total, width))
        positions = torch.full((total,), -1, dtype=torch.int32, device=kv.keys.device)
        for old, new, cap in zip(kv.offsets.tolist(), offsets.tolist(), old_caps):
            keys[new : new + cap] = kv.keys[old : old + cap]
            values[new : new + cap] = kv.values[old : old + cap]
            positions[new : new + cap] = kv.positions[old : old + cap]
        self.packed = _packed(keys, values, positions, offsets, caps, kv.window_start, kv.sink_end)
        self.caps = caps

    def batch_select_indices(self, indices: torch.Tensor | list[int]) -> None:
        """Keep the samples ``indices`` (``[B']``, in their new order), as transformers asks when a batch drops
        finished samples. Packed: the kept samples' rows stay where they are in the storage; only the per-row vectors
        are selected, so the decode kernels no longer visit the dropped rows."""
        if self.packed is None:
            super().batch_select_indices(indices)
            if self.dense:
                self.lengths = [self.lengths[b] for b in (indices.tolist() if isinstance(indices, torch.Tensor)
                                                          else list(indices))]
            return
        if self.row_slots:
            raise NotImplementedError("a static packed cache keeps its batch shape")
        samples = indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
        rows = [b * self.heads + h for b in samples for h in range(self.heads)]
        index = torch.tensor(rows, dtype=torch.long, device=self.newest.device)
        kv = self.packed
        self.caps = [self.caps[r] for r in rows]
        self.rings = [self.rings[r] for r in rows]
        self.lengths = [self.lengths[b] for b in samples]
        self.packed = _packed(kv.keys, kv.values, kv.positions, kv.offsets[index], self.caps, kv.window_start[index],
                              kv.sink_end[index])
        self.newest = self.newest[index]
        self.rule = dataclasses.replace(self.rule, ring=self.rule.ring[index], streaming=self.rule.streaming[index])

    def sample_nbytes(self, sample: int) -> tuple[int, int]:
        """(kept, full) bytes of batch row ``sample`` alone, once packed: the keys and values of the tokens its rows
        hold (a ring row at most its ``sink_end + window_span`` slots, any other row every token), and those of all its
        tokens in every row, ``[H, tokens, D]`` keys and values (prompt without padding, plus the decode tokens);
        counted on the host. kept <= full, equal when no row of the sample is a ring. A layer held dense: its sample's
        tokens, in full."""
        if self.dense:
            width = sum(t.shape[1] * t.shape[3] * t.element_size() for t in (self.keys, self.values))
            tokens = (self.lengths[sample] + self.steps) * width
            return tokens, tokens
        kv = self.packed
        width = kv.keys.shape[1] * (kv.keys.element_size() + kv.values.element_size())
        tokens = self.lengths[sample] + self.steps
        rows = range(sample * self.heads, (sample + 1) * self.heads)
        kept = sum(min(self.caps[r], tokens) if self.rings[r] else tokens for r in rows)
        return kept * width, self.heads * tokens * width

    # ---- what transformers asks of a layer -----------------------------------------------------------------------

    def get_seq_length(self) -> int:
        return self.tokens if self.packed is not None else super().get_seq_length()

    def nbytes(self) -> int:
        """Bytes of the keys and values kept: those of the samples' packed rows (`sample_nbytes`), or the dense
        ones."""
        if self.settled:
            return sum(self.sample_nbytes(b)[0] for b in range(len(self.lengths)))
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values) if t is not None)

    def full_nbytes(self) -> int:
        """Bytes a `DynamicCache` would hold for the samples' own tokens (``[H, tokens, D]`` keys and values each)."""
        if not self.settled:
            return self.nbytes()
        return sum(self.sample_nbytes(b)[1] for b in range(len(self.lengths)))

    def reset(self) -> None:
        """Drop the packed rows and the dense prompt: the layer takes the next prompt as a new one (a static layer:
        every row empty, its tensors kept). (Some transformers versions' `reset` zeroes ``keys`` in place when the
        layer is initialised; a packed layer has released them.)"""
        if self.row_slots and self.packed is not None:
            kv = self.packed
            for held, empty in ((kv.positions, -1), (self.newest, -1), (kv.window_start, 0), (kv.sink_end, 0),
                                (self.rule.ring, False), (self.rule.streaming, False)):
                held.fill_(empty)
            self.lengths, self.caps, self.rings = [], [], []
            self.tokens = self.steps = 0
            self.room = GROW
            return
        self.packed = None
        self.keys = self.values = None
        self.is_initialized = False
        self.dense, self.lengths = False, []
        super().reset()

    def _refuse(self, what: str) -> None:
        if self.packed is not None:
            raise NotImplementedError(f"a packed KV cache cannot {what}; use kv_cache='dynamic'")

    def crop(self, tokens_to_remove: int) -> None:
        self._refuse("be cropped")
        super().crop(tokens_to_remove)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._refuse("reorder its batch (beam search)")
        super().reorder_cache(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._refuse("repeat its batch")
        super().batch_repeat_interleave(repeats)


class PackedCache(Cache):
    """A transformers cache of `PackedLayer` layers (created lazily, one per attention layer, or made ``like`` a cache).

    Args:
        evict: STREAMING rows keep sink + window only (True), or every token (False: decode applies the window by
            mask, as upstream). Inside `elastic_bench.apply`, a forward given an empty `PackedCache` sets it from
            ``kv_cache``.
        like: an empty transformers cache whose layers were made from the model's config (``DynamicCache(config=...)``):
            its key-value layers (full or sliding) become `PackedLayer` layers, its others (linear attention) are kept;
            None, or a cache without layers yet: `PackedLayer` layers created as the model updates them.
        row_slots, rows: a static cache of ``rows`` samples: every row of every layer has ``row_slots`` slots at a
            fixed place, the samples are added one at a time from prompts packed alone (`add_sample`), and the tensors
            keep their addresses from one batch (after `reset`) to the next, so that a CUDA graph of the decode step
            captured over one batch replays over the next batch of that shape. 0: rows sized to what they keep, grown as
            needed, filled by a prefill.
    """

    def __init__(self, evict: bool = True, row_slots: int = 0, rows: int = 0, like: Cache | None = None):
        if bool(row_slots) != bool(rows):
            raise ValueError("a static packed cache needs both row_slots and rows")
        if like is not None and like.layers:
            super().__init__(layers=[PackedLayer() if type(layer) in KV_LAYERS else layer for layer in like.layers])
        else:
            super().__init__(layer_class_to_replicate=functools.partial(PackedLayer, row_slots, rows) if row_slots
                             else PackedLayer)
        self.evict = evict
        self.row_slots, self.rows = row_slots, rows

    def add_sample(self, source: PackedCache) -> None:
        """Copy ``source`` (one prompt's cache, packed alone) into this static cache as its next sample
        (`PackedLayer.add_sample`)."""
        if not self.row_slots:
            raise ValueError("add_sample fills a static packed cache (row_slots and rows)")
        if not all(isinstance(layer, PackedLayer) and layer.packed is not None for layer in source.layers):
            raise ValueError("a static packed cache (decode graphs) takes prompts whose every layer is packed; this "
                             "model has layers that are not (linear attention, MLA or learned sinks): run it without "
                             "decode graphs")
        while len(self.layers) < len(source.layers):
            self.layers.append(self.layer_class_to_replicate())
        for mine, theirs in zip(self.layers, source.layers):
            mine.add_sample(theirs)

    @property
    def kv_layers(self) -> list[PackedLayer]:
        """The layers that hold keys and values (not a linear-attention layer's state)."""
        return [layer for layer in self.layers if isinstance(layer, PackedLayer)]

    def reserve(self, tokens: int) -> None:
        """Room for ``tokens`` more decode tokens in every layer (`PackedLayer.reserve`)."""
        for layer in self.kv_layers:
            layer.reserve(tokens)

    def advance(self) -> None:
        """Count one decode token in every layer on the host (after a CUDA-graph replay of a step)."""
        for layer in self.kv_layers:
            layer.advance()

    def nbytes(self) -> int:
        """Bytes of the keys and values kept by all layers (`PackedLayer.sample_nbytes`)."""
        return sum(layer.nbytes() for layer in self.kv_layers)

    def full_nbytes(self) -> int:
        """Bytes a `DynamicCache` would hold for the same tokens."""
        return sum(layer.full_nbytes() for layer in self.kv_layers)

    def sample_nbytes(self, sample: int) -> tuple[int, int]:
        """(kept, full) bytes of keys and values of batch row ``sample`` alone, over all layers
        (`PackedLayer.sample_nbytes`): what a generation of that sample alone would keep, and a `DynamicCache` hold."""
        counts = [layer.sample_nbytes(sample) for layer in self.kv_layers]
        return sum(held for held, _ in counts), sum(full for _, full in counts)
