"""Per-sample ΩMSR / ΩESR, accumulated from the plans of every layer during a forward.

- ΩMSR: fraction of (layer, KV head) pairs whose mode is not FULL.
- ΩESR: mean over (layer, KV head) of ``1 - A/C`` with exact pair counts (`elastic_bench.kernels.pair_counts`);
  prefill chunks of one sample are summed before the ratio. ``omega_esr_last_row`` is the paper-figure variant
  ``1 - n(S-1)/S`` (see `reference/method.md` §7).
Decode steps are not counted: the measures describe the prefill.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from elastic_bench.kernels import HeadPlan, Mode, PairCounts


@dataclass
class _LayerTally:
    modes: torch.Tensor  # [H] of the latest prefill call
    attended: torch.Tensor  # [H] float64, summed over chunks
    causal: int
    attended_last: torch.Tensor  # [H] of the latest call
    causal_last: int


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

    def record(self, layer_idx: int, phase: str, sample_ids: list[int], plan: HeadPlan, counts: PairCounts) -> None:
        """Record one layer's plan for the given samples of the current forward (rows of ``plan``)."""
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
                    plan.modes[row], counts.attended[row], counts.causal, counts.attended_last[row], counts.causal_last
                )
            else:  # a later prefill chunk of the same sample
                tally.modes = plan.modes[row]
                tally.attended = tally.attended + counts.attended[row]
                tally.causal += counts.causal
                tally.attended_last, tally.causal_last = counts.attended_last[row], counts.causal_last

    def decisions(self) -> torch.Tensor:
        """Modes ``[N, L, H]`` (uint8) of the N samples recorded since the last reset."""
        if not self.samples:
            return torch.empty(0, 0, 0, dtype=torch.uint8)
        return torch.stack([torch.stack([s[i].modes.cpu() for i in sorted(s)]) for s in self.samples])

    def per_sample(self) -> list[dict[str, float]]:
        """ΩMSR, ΩESR and last-row ΩESR of every recorded sample."""
        result = []
        for sample in self.samples:
            layers = [sample[i] for i in sorted(sample)]
            modes = torch.stack([t.modes.cpu() for t in layers])
            attended = torch.stack([t.attended.cpu() for t in layers])
            causal = torch.tensor([float(t.causal) for t in layers], dtype=torch.float64)
            last = torch.stack([t.attended_last.cpu() for t in layers])
            causal_last = torch.tensor([float(t.causal_last) for t in layers], dtype=torch.float64)
            result.append(
                {
                    "omega_msr": float((modes != Mode.FULL).double().mean()),
                    "omega_esr": float((1 - attended / causal[:, None]).mean()),
                    "omega_esr_last_row": float((1 - last / causal_last[:, None]).mean()),
                }
            )
        return result
