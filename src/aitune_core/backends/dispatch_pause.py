"""`original_forwards_only()`: while it is held (by any thread), every tuned call in the process is answered by its
module's original forward.

Why: some tracing cannot run beside compiled calls. `torch.export` patches process-wide state while it traces: in
strict mode dynamo's config (a compiled backend called meanwhile on another thread missed its cache and
recompiled, for about a second on a 2-core CPU, under the exporter's settings), in non-strict mode the module calls
themselves (an eager call failed inside fake-tensor code). The background worker holds this while it exports a
graph for a package (`aitune_core.aoti_packaging`); the calls served meanwhile run eagerly, as before tuning, and
the dispatcher (`dispatcher.py`) reads one integer per call to know.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
#: holders of the pause (a list so that readers need no lock: one item read per call)
HOLDERS = [0]


def paused() -> bool:
    """True while someone holds `original_forwards_only`."""
    return HOLDERS[0] > 0


@contextmanager
def original_forwards_only() -> Iterator[None]:
    """Send every tuned call to the original forward for the duration (nestable, from any thread)."""
    with _lock:
        HOLDERS[0] += 1
    try:
        yield
    finally:
        with _lock:
            HOLDERS[0] -= 1
