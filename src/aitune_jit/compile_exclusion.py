"""A node changes the modules it watches only while no dynamo compile runs on another thread.

Why: when a node's state changes (`NodeTransitions.apply`), aitune sets or removes instance attributes of the
program's modules (the `forward` wrapper of a recording or tuned module, the node's own slot, a subtree's
children becoming candidates). With background tuning that happens on the job thread. A program that compiles
one of those modules with `torch.compile` on its own thread at that moment has dynamo build a guard on the very
attribute (`___check_obj_id(self._modules['l1'].forward, ...)`) and check it when the compile ends: the guard
failed on the frame it was made for, and dynamo raised "Guard failed on the same frame it was created" into the
program (a reviewer's script that compiled a small model every few requests while aitune tuned another: 2 of
3 runs on this CPU; 0 of 4 since).

How: dynamo compiles one frame at a time per process, under `torch._dynamo.convert_frame.compile_lock` (a
re-entrant lock held for the whole compile, guards included). `excluding_compiles()` holds the same lock while
a transition runs, so a transition waits for another thread's compile to end and a compile waits for the
transition (short: attribute changes and the history line). Nothing is imported for it: a process that has
not loaded dynamo has no compile to wait for. A thread that cannot get the lock within `WAIT_S` (a compile
that hangs) changes the attributes anyway rather than hang with it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

_logger = logging.getLogger("aitune.jit")

#: the longest a transition waits for another thread's compile
WAIT_S = 120.0


@contextlib.contextmanager
def excluding_compiles(wait_s: float | None = None) -> Iterator[bool]:
    """Hold dynamo's compile lock for the block when dynamo is loaded (see the module docstring). Yields whether
    no other thread compiles now: False only when the lock was not had within `wait_s` (default `WAIT_S`; the block
    runs anyway; a caller that must not wait passes 0 and acts only on True)."""
    wait_s = WAIT_S if wait_s is None else wait_s
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    lock = getattr(convert_frame, "compile_lock", None)
    if lock is None:
        yield True
        return
    acquired = lock.acquire(timeout=wait_s) if wait_s > 0 else lock.acquire(blocking=False)
    if not acquired and wait_s > 0:
        _logger.debug("a dynamo compile on another thread held its lock for %.0f s; changing modules anyway", wait_s)
    try:
        yield acquired
    finally:
        if acquired:
            lock.release()
