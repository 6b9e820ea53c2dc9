"""At most a few calls' worth of GPU work queued ahead by a thread that runs calls in a loop.

A CUDA call returns once its kernels are queued. A loop of calls that synchronizes rarely runs far ahead of the
GPU: `profiling.measure_all` synchronized once every 30 timed calls after a warm-up of 10, which for ResNet-50 or
BERT-base at batch 32 is about 200 ms of queued work. A serving thread's request launched meanwhile, and ending
in `torch.cuda.synchronize()`, waited for all of it: the slowest requests while a background job measured its
candidates took 207-211 ms on an H200 against eager's p99 of 12-20 ms (benchmarks/results/
background_tuning-h200-resnet50-bert-mixed-lazydraws-2f70d70.json).

`CallBacklog(depth)` keeps at most `depth` calls in flight: `before_call()` waits until the call `depth` back has
ended on the GPU (`torch.cuda.Event.synchronize` releases the GIL, so the serving thread runs meanwhile), and
`after_call(end)` notes the event recorded after a call. With two in flight one call runs while the next is
queued, so the GPU is never idle inside a call and the events that time each call measure what they measured
before. `depth=0` leaves the loop unbounded.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch


class CallBacklog:
    """The end events of the calls still queued by one loop; see the module docstring."""

    def __init__(self, depth: int = 2, make_event: Callable[[], Any] | None = None) -> None:
        if depth < 0:
            raise ValueError(f"depth must be >= 0 (0: unbounded), got {depth}")
        self.depth = depth
        self._make_event = make_event or torch.cuda.Event
        self._ends: collections.deque[Any] = collections.deque()
        self.waits = 0  # (how many times `before_call` waited for an earlier call: for tests and probes)

    def before_call(self) -> None:
        """Wait until fewer than `depth` noted calls are still queued or running."""
        if not self.depth:
            return
        while len(self._ends) >= self.depth:
            end = self._ends.popleft()
            if not end.query():
                self.waits += 1
                end.synchronize()

    def after_call(self, end: Any | None = None) -> None:
        """Note a call just queued: by `end`, an event recorded after it, or a new one recorded now."""
        if not self.depth:
            return
        if end is None:
            end = self._make_event()
            end.record()
        self._ends.append(end)
