"""Marks the current thread as inside a timed call.

Why: a background tuning job steps aside while requests are served (`aitune_jit.worker_yield`). A pause inside
a timed call would be measured as the backend's time, so `profiling.timing_unpaused` marks its thread and the
job's gate does not pause it there. This file imports nothing but the standard library: the gate reads the
mark on its hot path, and the gate's module stays free of torch.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_local = threading.local()


@contextlib.contextmanager
def timed() -> Iterator[None]:
    """The current thread is inside a timed call for the duration (nests)."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    try:
        yield
    finally:
        _local.depth = depth


def timing_now() -> bool:
    """True while the current thread is inside `timed()`."""
    return getattr(_local, "depth", 0) > 0
