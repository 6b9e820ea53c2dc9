"""FX traces run one at a time in the process while background tuning is on.

Why: `torch.fx.Tracer.trace` (under `torch.fx.symbolic_trace`, and under make_fx, which AOTAutograd runs inside
every compile and `torch.export` runs to export) replaces `torch.nn.Module.__call__` and `__getattr__` for the
whole process while it traces, and keeps its patcher in a module global. Two threads tracing at once each run
the other's module calls through their own tracer: both traces failed ("module is not installed as a
submodule", then "CURRENT_PATCHER is None in finally block"), and `Module.__call__` could be left patched, so
every later module call of the program failed the same way. Without aitune a program traces on its own
thread only; with a background job it traces beside the job's compiles (a reviewer's script that ran
`symbolic_trace` while aitune tuned another model: 2 of 3 runs broken).

How: while installed, `Tracer.trace` holds one re-entrant lock, so a trace waits for another thread's trace to
end (a nested trace on the same thread goes on). A job thread holding the lock while a program thread waits
for it does not step aside for requests (`others_waiting_here`, given to the job's gate): the request is
waiting for the job. The patch (`aitune_core.patch.Patch`) is applied before the first job starts, next to
`job_rng`, and taken off when JIT tuning is switched off.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch.fx

from aitune_core.patch import Patch

_trace_lock = threading.RLock()
_state_lock = threading.Lock()
_holder: int | None = None  # the thread inside the outermost trace
_waiting = 0  # threads waiting for `_trace_lock`
_patch: Patch | None = None


def others_waiting_here() -> bool:
    """True on the thread that traces while another thread waits to trace."""
    return _waiting > 0 and _holder == threading.get_ident()


def _serialized(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def trace(self: Any, *args: Any, **kwargs: Any) -> Any:
        global _holder, _waiting
        me = threading.get_ident()
        if not _trace_lock.acquire(blocking=False):
            with _state_lock:
                _waiting += 1
            try:
                _trace_lock.acquire()
            finally:
                with _state_lock:
                    _waiting -= 1
        outer = _holder != me
        if outer:
            _holder = me
        try:
            return original(self, *args, **kwargs)
        finally:
            if outer:
                _holder = None
            _trace_lock.release()

    trace.__aitune_fx_trace_lock__ = True  # type: ignore[attr-defined]
    return trace


def install() -> None:
    """Serialize `torch.fx.Tracer.trace` across threads (idempotent)."""
    global _patch
    with _state_lock:
        current = torch.fx.Tracer.trace
        if _patch is not None or getattr(current, "__aitune_fx_trace_lock__", False):
            return
        _patch = Patch(torch.fx.Tracer, "trace", _serialized(current)).apply()


def uninstall() -> None:
    """Put `Tracer.trace` back (a newer patch of it by someone else stays: `Patch.restore`)."""
    global _patch
    with _state_lock:
        if _patch is not None:
            _patch.restore()
            _patch = None


def installed() -> bool:
    return _patch is not None
