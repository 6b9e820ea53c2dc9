"""Whether a job steps aside for requests while it rebuilds a decision from warm caches (`running_freely`).

A rebuild of a decision another process took, or the load of its package, is short in the common case: its
caches are warm. Whether its gate (`worker_yield`) is worth what it costs depends on the device; measured below.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from aitune_jit.worker_env import env_choice
from aitune_jit.worker_yield import current_gate


@contextlib.contextmanager
def running_freely(device_type: str) -> Iterator[None]:
    """The current job does not step aside inside the block when `warm_rebuilds_step_aside(device_type)` says so:
    for the rebuild of a decision another process took, or the load of its package, from warm caches in the
    common case (`decisions.reuse`, `packaging.warm_starts`).

    Why on the CPU only, by default: such a job is short, and the gate makes it longer. On this project's 2-core
    CPU (Python 3.11, the trace function) the warm process of `tests/aitune_jit/scripts/serve_loop.py` was tuned
    4.3-5.2 s after its first request with the gate and 2.7-3.0 s without, its slowest request about the same.
    On an H100 (`background_tuning-h100-resnet50-bert-mixed-warmfree-65924aa`) the warm BERT-base rebuild took
    10.6 s without the gate against 17.7 s with it, but the requests' p99 was 211 ms against 70 ms (eager 21 ms):
    GPU requests launch their kernels under the GIL, and the rebuild's own CUDA work shares the device."""
    gate = current_gate()
    if gate is None or warm_rebuilds_step_aside(device_type):
        yield
        return
    with gate.off():
        yield


def warm_rebuilds_step_aside(device_type: str) -> bool:
    """`AITUNE_WORKER_YIELD_WARM`: auto (default: not on the CPU, `running_freely`), on (always) or off (never)."""
    choice = env_choice("AITUNE_WORKER_YIELD_WARM", ("auto", "on", "off"), "auto")
    return choice == "on" or (choice == "auto" and device_type != "cpu")
