"""Timing work on a device, one way for the benchmarks (kernel, prefill, decode) and a run's prefill and decode times,
and a prefill's time taken apart (`PartTimer`, `part`).

On a CUDA device a mark is an event recorded on the current stream: marks are queued without synchronising, so the
host's launch work between them is hidden and the timings are the device's; they are read at the end, once the device
has reached them (`DeviceTimer.elapsed`). Elsewhere (the CPU) the host runs the work as it is issued and a mark is
``perf_counter``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

Mark = torch.cuda.Event | float  # an event recorded on the device's stream, or a perf_counter reading


class DeviceTimer:
    """Spans of the work issued to ``device``: `span` (or two `mark` calls) brackets the work, `elapsed` reads the
    seconds of every span at the end.

    Example::

        timer = DeviceTimer(device)
        for _ in range(3):
            with timer.span():
                model(ids)
        seconds = timer.elapsed()  # one value per span
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.spans: list[tuple[Mark, Mark]] = []  # (start, stop) of each `span`, in order

    def mark(self) -> Mark:
        """The time now, as the device will run the work issued after it."""
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @contextmanager
    def span(self) -> Iterator[None]:
        """Time the work issued in the block as one span (appended to `spans`)."""
        start = self.mark()
        yield
        self.spans.append((start, self.mark()))

    def elapsed(self, spans: Iterable[tuple[Mark, Mark]] | None = None) -> list[float]:
        """Seconds of each ``(start, stop)`` pair of marks (default: every `span` so far), once the device has run the
        work up to every stop mark."""
        spans = self.spans if spans is None else list(spans)
        if not self.cuda:
            return [stop - start for start, stop in spans]
        for _, stop in spans:
            stop.synchronize()
        return [start.elapsed_time(stop) / 1000 for start, stop in spans]


PARTS = ("model", "routing", "estimation", "planning", "accounting", "attention")
"""What a prefill's time is taken apart into (`PartTimer`): ``model``, the model's own layers and modules outside
attention (projections, norms, MLP, embeddings, LM head); ``routing``, a method's plan less the parts below it (a
router's forward, a gate lookup, the plan's own tensors); ``estimation``, the scoring and selection of blocks
(XAttention's antidiagonal scores and threshold selection, the oracle's dense scores); ``planning``, block lists
built from a selection (CSR rows); ``accounting``, the harness's count of the pairs a plan computes (ΩMSR / ΩESR,
not a cost of the method); ``attention``, the attention kernels."""

_ACTIVE: ContextVar[PartTimer | None] = ContextVar("elastic_bench_part_timer", default=None)


class PartTimer:
    """Nested named spans of one forward's work (`DeviceTimer` marks: CUDA events, no synchronisation, on a CUDA
    device; perf_counter elsewhere), entered by `part` while the timer is `active`. A part's time is the time of its
    spans less that of the spans nested in them, so the parts add up to the time of the outermost spans; what no span
    covers is the caller's total less their sum (`unexplained`).

    Example::

        timer = PartTimer(device)
        with timer.active():
            model(ids)          # code inside calls `with part("attention"): ...`
        seconds = timer.totals()  # {"attention": ..., ...}
    """

    def __init__(self, device: torch.device | str):
        self.timer = DeviceTimer(device)
        self._spans: list[tuple[str, int | None, Mark]] = []  # (name, enclosing span, start) of each span, in order
        self._stops: dict[int, Mark] = {}
        self._open: list[int] = []

    def enter(self, name: str) -> None:
        """Open a span of ``name`` inside the innermost open one."""
        self._spans.append((name, self._open[-1] if self._open else None, self.timer.mark()))
        self._open.append(len(self._spans) - 1)

    def exit(self) -> None:
        """Close the innermost open span."""
        self._stops[self._open.pop()] = self.timer.mark()

    @contextmanager
    def active(self) -> Iterator[PartTimer]:
        """`part` spans in the block are this timer's."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    def totals(self) -> dict[str, float]:
        """Seconds per part name: each closed span's time less that of the closed spans directly inside it, summed by
        name (on CUDA, once the device has run the work; spans left open, by an error, are not counted)."""
        closed = [i for i in range(len(self._spans)) if i in self._stops]
        seconds = dict(zip(closed, self.timer.elapsed((self._spans[i][2], self._stops[i]) for i in closed)))
        found: dict[str, float] = {}
        for i, own in seconds.items():
            found[self._spans[i][0]] = found.get(self._spans[i][0], 0.0) + own
            parent = self._spans[i][1]
            if parent in seconds:
                found[self._spans[parent][0]] = found.get(self._spans[parent][0], 0.0) - own
        return found


@contextmanager
def part(name: str) -> Iterator[None]:
    """Time the block as a span of the part ``name`` (`PARTS`) of the active `PartTimer`; nothing without one."""
    timer = _ACTIVE.get()
    if timer is None:
        yield
        return
    timer.enter(name)
    try:
        yield
    finally:
        timer.exit()


def unexplained(total: float, parts: dict[str, float]) -> float:
    """The seconds of ``total`` (a timed forward) that no part covers: ``total`` less the sum of ``parts``."""
    return total - sum(parts.values())
