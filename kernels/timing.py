"""Timing work on a device, one way for the benchmarks (kernel, prefill, decode) and a run's prefill and decode times.

On a CUDA device a mark is an event recorded on the current stream: marks are queued without synchronising, so the
host's launch work between them is hidden and the timings are the device's; they are read at the end, once the device
has reached them (`DeviceTimer.elapsed`). Elsewhere (the CPU) the host runs the work as it is issued and a mark is
``perf_counter``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

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
