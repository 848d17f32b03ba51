"""Sparsity of HeadPlans: exact (query, key) pair counts, and per-sample ΩMSR / ΩESR over a forward's layers.

Definitions (Elastic Attention, https://arxiv.org/abs/2601.17367, Def. 2.1, Eq. 4 and Def. 2.2, Eq. 5;
ΩESR is counted exactly, pair by pair, over all layers):
- ``A(h)`` is the number of causal pairs a head computes (for a KV head whose G query heads have different block
  masks, the mean over those query heads); ``C`` the number of causal pairs, ``C = Σ_i (p_i + 1)`` with
  ``p_i = Lk - Lq + i``; a head's pruning ratio is ``ρ(h) = 1 - A(h)/C``.
- ΩMSR: the fraction of the routed (layer, KV head) pairs whose mode is not FULL: the layers a method plans (full
  softmax attention), not those the model itself restricts (a sliding-window layer, recorded as the model's own).
- ΩESR: the mean of the method's ``ρ`` over the (layer, KV head) pairs of every softmax layer, a layer of the model's
  own pattern counting 0; prefill chunks of one sample are summed before the ratio. ``omega_esr_model`` is the same
  mean of the pairs the model itself skips (its sliding windows), so the two add up to the share of causal pairs not
  computed, the method's shown apart from the model's. ``omega_esr_last_row`` is the variant of the paper's figures,
  the method's pruning seen by the last query only. Layers without softmax attention (linear / recurrent) call no
  attention and are not counted.
- Attention FLOPs: each layer's attended pairs weighted by its FLOPs per pair (``pair_flops``, which the caller
  knows: ``2·(D_qk + D_v)`` per query head); ``attention_share`` is the method's attention FLOPs over those of the
  model's own pattern with every routed layer dense (1 for full attention), ``attention_flops_full`` the latter.
- A chunked-prefill streaming geometry counts what the chunked prefill computes: its dense first chunk, then per chunk
  the sink, the keys kept before the chunk and the causal part of the chunk (`streaming_pairs`).
Decode steps are not counted: the measures describe the prefill.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import torch

from .plan import HeadPlan, Mode, StreamingGeometry


@dataclass(frozen=True)
class PairCounts:
    """Pair counts of one plan.

    Attributes:
        attended: float64 ``[B, H]``: pairs computed per KV head (mean over the head's query heads).
        causal: causal pairs ``C`` of the call.
        attended_last: float64 ``[B, H]``: keys seen by the last query (for ``esr_mode="last_row"``).
        causal_last: keys visible to the last query under dense causal attention (``Lk``).
        queries: the call's queries (``Lq``).
    """

    attended: torch.Tensor
    causal: int
    attended_last: torch.Tensor
    causal_last: int
    queries: int = 0


def causal_pairs(q_len: int, k_len: int) -> int:
    """``Σ_i (Lk - Lq + i + 1)`` for ``i < Lq``."""
    return q_len * (k_len - q_len) + q_len * (q_len + 1) // 2


@lru_cache(maxsize=256)
def streaming_pairs(q_len: int, k_len: int, geometry: StreamingGeometry, block_size: int) -> tuple[int, int]:
    """(pairs, keys seen by the last query) of one STREAMING head.

    A query at position ``p`` with window start ``w`` and sink end ``s`` (`StreamingGeometry`) sees every key
    ``j <= p`` when ``w <= s`` (the window reaches the sink), else ``s + p - w + 1`` keys. For a chunked prefill
    (``w = chunk start - local``) that is a dense first chunk, then per chunk the sink, the ``local`` keys before it
    and the causal part of the chunk, the overlap of sink and window counted once.
    """
    p = torch.arange(k_len - q_len, k_len, dtype=torch.int64)
    sink, w = geometry.sink_end(block_size), geometry.window_start(p, block_size)
    n = torch.where(w <= sink, p + 1, sink + p - w + 1)
    return int(n.sum()), int(n[-1]) if q_len else 0


def _block_sparse_pairs(plan: HeadPlan, q_len: int, k_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query head ``[B, Hq]`` (pairs, keys seen by the last query) of the block selection."""
    sel, bs = plan.blocks, plan.block_size
    B, Hq, nQ = sel.shape
    device = sel.counts.device
    p = torch.arange(k_len - q_len, k_len)  # on the host, as what depends on the shapes alone: no device sync
    rows = p // bs
    q_per_row = torch.bincount(rows, minlength=nQ).to(torch.float64)[:nQ].to(device, non_blocking=True)
    diag_per_row = torch.bincount(rows, weights=(p - rows * bs + 1).to(torch.float64), minlength=nQ)[:nQ].to(
        device, non_blocking=True)
    entry_row = torch.repeat_interleave(torch.arange(B * Hq * nQ, device=device), sel.counts.flatten().long(),
                                        output_size=sel.indices.numel())
    r, c = entry_row % nQ, sel.indices.long()
    below = (c < r).to(torch.float64)
    on_diag = c == r
    contrib = below * q_per_row[r] * bs + on_diag * diag_per_row[r]
    attended = torch.zeros(B * Hq, dtype=torch.float64, device=device).index_add_(0, entry_row // nQ, contrib)
    last, r_last = k_len - 1, (k_len - 1) // bs
    in_last = (r == r_last).to(torch.float64)
    contrib_last = in_last * (below * bs + on_diag * (last - r_last * bs + 1))
    attended_last = torch.zeros(B * Hq, dtype=torch.float64, device=device).index_add_(0, entry_row // nQ, contrib_last)
    return attended.view(B, Hq), attended_last.view(B, Hq)


def pair_counts(plan: HeadPlan, q_len: int, k_len: int, num_query_heads: int) -> PairCounts:
    """Exact attended-pair counts of ``plan`` for a call with ``q_len`` queries over ``k_len`` keys."""
    B, H = plan.modes.shape
    G = num_query_heads // H
    device = plan.blocks.counts.device if plan.blocks is not None else plan.modes.device  # where the counts are
    modes = plan.modes.to(device, non_blocking=True).long()
    total = causal_pairs(q_len, k_len)
    attended = torch.full((B, H), float(total), dtype=torch.float64, device=modes.device)
    attended_last = torch.full((B, H), float(k_len if q_len else 0), dtype=torch.float64, device=modes.device)
    # what the modes select is taken on the device, never read on the host (device modes would synchronise)
    pairs, last = streaming_pairs(q_len, k_len, plan.streaming, plan.block_size)
    attended = torch.where(modes == Mode.STREAMING, float(pairs), attended)
    attended_last = torch.where(modes == Mode.STREAMING, float(last), attended_last)
    if plan.blocks is not None:  # present wherever a head is BLOCK_SPARSE
        sparse, sparse_last = _block_sparse_pairs(plan, q_len, k_len)
        is_sparse = modes == Mode.BLOCK_SPARSE
        attended = torch.where(is_sparse, sparse.view(B, H, G).mean(-1), attended)
        attended_last = torch.where(is_sparse, sparse_last.view(B, H, G).mean(-1), attended_last)
    return PairCounts(attended, total, attended_last, k_len, q_len)


@dataclass
class _LayerTally:
    modes: torch.Tensor  # [H] of the latest prefill call
    attended: torch.Tensor  # [H] float64, summed over chunks
    causal: int
    attended_last: torch.Tensor  # [H] of the latest call
    causal_last: int
    tokens: int  # queries, summed over chunks
    own: bool = False  # the model's own pattern (a sliding-window layer), not the method's plan
    pair_flops: float = 1.0  # FLOPs of one causal pair of one KV head (its query heads together)


@dataclass
class SparsityMeter:
    """Collects plans per sample and layer. A sample opens at its first prefill after `new_forward`."""

    samples: list[dict[int, _LayerTally]] = field(default_factory=list)
    _base: int = 0
    _pending_forward: bool = True

    def reset(self) -> None:
        self.samples.clear()
        self._base, self._pending_forward = 0, True

    def new_forward(self) -> None:
        """Mark the start of a model forward; the next prefill call opens new samples."""
        self._pending_forward = True

    def record(self, layer_idx: int, phase: str, sample_ids: list[int], plan: HeadPlan, counts: PairCounts,
               own: bool = False, pair_flops: float = 1.0) -> None:
        """Record one layer's plan for the given samples of the current forward (rows of ``plan``); ``own``: the plan
        is the model's own pattern (a sliding window), not the method's; ``pair_flops``: FLOPs of one causal pair of
        one KV head."""
        if phase == "decode":
            return
        if phase == "prefill" and self._pending_forward:
            self._base, self._pending_forward = len(self.samples), False
        for row, sample in enumerate(sample_ids):
            index = self._base + sample
            while len(self.samples) <= index:
                self.samples.append({})
            tally = self.samples[index].get(layer_idx)
            if tally is None or phase == "prefill":
                self.samples[index][layer_idx] = _LayerTally(
                    plan.modes[row], counts.attended[row], counts.causal, counts.attended_last[row], counts.causal_last,
                    counts.queries, own, pair_flops,
                )
            else:  # a later prefill chunk of the same sample
                tally.modes = plan.modes[row]
                tally.attended = tally.attended + counts.attended[row]
                tally.causal += counts.causal
                tally.tokens += counts.queries
                tally.attended_last, tally.causal_last = counts.attended_last[row], counts.causal_last

    def decisions(self) -> torch.Tensor:
        """Modes ``[N, L, H]`` (uint8) of the N samples recorded since the last reset, over the L routed layers (the
        model's own patterns left out)."""
        if not self.samples:
            return torch.empty(0, 0, 0, dtype=torch.uint8)
        return torch.stack([torch.stack([s[i].modes.cpu() for i in sorted(s) if not s[i].own]) for s in self.samples])

    def routed_layers(self) -> list[int]:
        """The ``layer_idx`` of the routed layers of the recorded samples, in order (the layers of `decisions`)."""
        return sorted({i for s in self.samples for i, t in s.items() if not t.own})

    def per_sample(self) -> list[dict[str, float]]:
        """Per recorded sample: ΩMSR (routed layers), ΩESR, last-row ΩESR and ``omega_esr_model`` (every softmax
        layer), ``attention_share``, and ``attention_flops_full`` and ``tokens`` (the prompt's), for a cost model."""
        result = []
        for sample in self.samples:
            layers = [sample[i] for i in sorted(sample)]
            modes = torch.cat([t.modes.cpu() for t in layers if not t.own])
            skipped = [1 - t.attended.cpu() / t.causal for t in layers]  # [H] per layer
            last = [1 - t.attended_last.cpu() / t.causal_last for t in layers]
            method = torch.cat([torch.zeros_like(r) if t.own else r for r, t in zip(skipped, layers)])
            model = torch.cat([r if t.own else torch.zeros_like(r) for r, t in zip(skipped, layers)])
            method_last = torch.cat([torch.zeros_like(r) if t.own else r for r, t in zip(last, layers)])
            flops = sum(t.pair_flops * float(t.attended.sum()) for t in layers)
            full = sum(t.pair_flops * (float(t.attended.sum()) if t.own else t.causal * len(t.attended))
                       for t in layers)
            result.append(
                {
                    "omega_msr": float((modes != Mode.FULL).double().mean()) if len(modes) else float("nan"),
                    "omega_esr": float(method.double().mean()),
                    "omega_esr_last_row": float(method_last.double().mean()),
                    "omega_esr_model": float(model.double().mean()),
                    "attention_share": flops / full if full else 1.0,
                    "attention_flops_full": full,
                    "tokens": layers[0].tokens,
                }
            )
        return result


STATISTICS = ("omega_msr", "omega_esr", "omega_esr_last_row", "omega_esr_model", "attention_share")
"""The sparsity values of each `SparsityMeter.per_sample` entry that a cell averages."""


def sample_means(samples: list[dict[str, float]], keys: tuple[str, ...] = STATISTICS) -> dict[str, float]:
    """The mean of each of ``keys`` over ``samples`` (`SparsityMeter.per_sample` entries); NaN for none."""
    return {key: sum(s[key] for s in samples) / len(samples) if samples else float("nan") for key in keys}
