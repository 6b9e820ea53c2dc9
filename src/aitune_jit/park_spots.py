"""Where on a job thread's stack the step-aside gate may hold the job while the program forks (`worker_yield`).

Why: a fork copies every lock into the child held as it was, and the child has none of the parent's other
threads to release them (`fork_safety`). At a Python function start the job is in none of torch's own C++ code
of that frame (a C++ static being initialized, an operator's mutex), but it may still hold a Python-level lock:

- inside an import, that module's import lock (a child importing the module waited for good);
- inside `logging` or `concurrent.futures`, a lock the library's own before-fork hook takes: parked there, the
  job stalled every fork until the gate gave up (`logging`'s hook waited for the lock the parked job held);
- inside `threading` or `queue`, a condition's lock another thread is about to wait for.

Functions called back from C++ (`__torch_dispatch__`, a Python decomposition) are function starts too: a C++
frame below them may hold something; no such case is known.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
from typing import Any

#: the standard library's files whose code runs while it holds a lock that its own before-fork hooks take
#: (`logging`'s module lock) or that other threads wait for (`threading`, `queue`)
STDLIB_LOCKING = frozenset(module.__file__ for module in (threading, logging, queue) if module.__file__)
_FUTURES_DIR = os.path.join(os.path.dirname(threading.__file__), "concurrent", "futures") + os.sep
_GATE_FILES = frozenset({__file__.replace("park_spots.py", "worker_yield.py"), __file__})


def importing(frame: Any) -> bool:
    """Whether the thread running `frame` is inside an import (it holds that module's import lock)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_find_and_load" and "importlib._bootstrap" in code.co_filename:
            return True
        frame = frame.f_back
    return False


def starting_frame() -> Any:
    """Called inside the gate: the frame of the function whose start the gate is checking (the first one below the
    gate's own frames)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in _GATE_FILES:
        frame = frame.f_back
    return frame


def parkable(frame: Any) -> bool:
    """Whether a job thread starting the function of `frame` may be held there for a fork: not inside an import,
    and neither that function nor its caller in `STDLIB_LOCKING`, `concurrent.futures` or frozen code."""
    if frame is None or importing(frame):
        return False
    for here in (frame, frame.f_back):
        name = here.f_code.co_filename if here is not None else ""
        if name in STDLIB_LOCKING or name.startswith((_FUTURES_DIR, "<frozen ")):
            return False
    return True
