"""FX traces run one at a time in the process while background tuning is on.

Why: `torch.fx.Tracer.trace` (under `torch.fx.symbolic_trace`, and under make_fx, which AOTAutograd runs inside
every compile and `torch.export` runs to export) replaces `torch.nn.Module.__call__` and `__getattr__` for the
whole process while it traces, and keeps its patcher in a module global. Two threads tracing at once each run
the other's module calls through their own tracer: both traces failed ("module is not installed as a
submodule", then "CURRENT_PATCHER is None in finally block"), and `Module.__call__` could be left patched, so
every later module call of the program failed the same way. Without aitune a program traces on its own
thread only; with a background job it traces beside the job's compiles (a reviewer's script that ran
`symbolic_trace` while aitune tuned another model: 2 of 3 runs broken).

Dynamo takes part too: each frame it compiles runs inside `_maybe_revert_all_patches`, which takes the
process's current FX patches (`torch.fx._symbolic_trace.CURRENT_PATCHER`, another thread's trace included) off
and puts them back when the compile ends - after that trace may have ended and put `Module.__call__` back, so
the patch stayed and the program's next plain module call failed inside FX's tracer (1 of 4 runs of that
script with the lock below alone).

How: while installed, the outermost `Tracer.trace` of a thread holds dynamo's `compile_lock` (when dynamo is
loaded; dynamo holds it for each whole frame compile) and then one re-entrant lock of this module, so a trace
waits for another thread's trace or dynamo compile to end, and a compile for a trace; a nested trace on the
same thread goes on. A job holding either lock while a program thread waits does not step aside for requests
(`others_waiting_here`, given to the job's gate): the request is waiting for the job. What is left: a trace the
program started before dynamo was first imported is not waited for by the first compile. The patch
(`aitune_core.patch.Patch`) is applied before the first job starts, next to `job_rng`, and taken off when JIT
tuning is switched off.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch.fx

from aitune_core.patch import Patch

_trace_lock = threading.RLock()
_state_lock = threading.Lock()
_holder: int | None = None  # the thread inside the outermost trace
_waiting = 0  # threads waiting to start a trace
_patch: Patch | None = None


def _compile_lock() -> Any:
    """Dynamo's lock for a frame's compile, or None while dynamo is not loaded (nothing compiles then)."""
    return getattr(sys.modules.get("torch._dynamo.convert_frame"), "compile_lock", None)


def _holds(lock: Any) -> bool:
    is_owned = getattr(lock, "_is_owned", None)
    return bool(is_owned()) if is_owned is not None else False


def others_waiting_here() -> bool:
    """True on a thread that traces or compiles while another thread waits to trace."""
    if _waiting <= 0:
        return False
    return _holder == threading.get_ident() or _holds(_compile_lock())


def _acquire(lock: Any) -> None:
    global _waiting
    if lock.acquire(blocking=False):
        return
    with _state_lock:
        _waiting += 1
    try:
        lock.acquire()
    finally:
        with _state_lock:
            _waiting -= 1


def _serialized(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def trace(self: Any, *args: Any, **kwargs: Any) -> Any:
        global _holder
        me = threading.get_ident()
        if _holder == me:  # a nested trace: this thread holds what it needs
            return original(self, *args, **kwargs)
        compile_lock = _compile_lock()  # (first: the order dynamo's own compiles take them in)
        if compile_lock is not None:
            _acquire(compile_lock)
        try:
            _acquire(_trace_lock)
            _holder = me
            try:
                return original(self, *args, **kwargs)
            finally:
                _holder = None
                _trace_lock.release()
        finally:
            if compile_lock is not None:
                compile_lock.release()

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
