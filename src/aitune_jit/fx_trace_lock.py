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
program started before dynamo was first imported is not waited for by the first compile.

FX's "a trace is running" flag is process-wide as well, and a function compiled with `torch.compile` refuses to
run while it is up ("Detected that you are using FX to symbolically trace a dynamo-optimized function"): while
the program traced, the job's compiled candidate failed its warm-up and the module stayed eager. While
installed, `torch.fx._symbolic_trace.is_fx_symbolic_tracing` answers for the calling thread: False on a thread
while another thread's trace holds the lock (its compile then waits for that trace through dynamo's lock).
Compiled functions look the function up when `torch.compile` wraps them, so this covers every compile made
after the first job was queued.

Even one trace at a time reaches other threads: FX's `Module.__call__` and `__getattr__` stand-ins call the
tracer's `call_module` and `getattr` for every module call and attribute read in the process. A job's plain
eager calls (its baseline, its validation) made while the program traced failed ("module is not installed as a
submodule": the job's candidate failed in 4 of 5 runs of the reviewer's script), and a parameter another thread
read from a module the program was tracing would have come back as the trace's proxy. While installed,
`Tracer.call_module` and `Tracer.getattr` act only on the tracing thread; any other thread gets the plain call
and the plain attribute. The patches
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
import torch.fx._symbolic_trace as fx_symbolic_trace

from aitune_core.patch import Patch

_trace_lock = threading.RLock()
_state_lock = threading.Lock()
_holder: int | None = None  # the thread inside the outermost trace
_waiting = 0  # threads waiting to start a trace
_patches: list[Patch] = []
_enabled = False  # the wrappers act only while installed (one may outlive `uninstall` inside dynamo's)


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
        if not _enabled or _holder == me:  # switched off, or a nested trace: this thread holds what it needs
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


def _this_threads_flag(original: Callable[[], bool]) -> Callable[[], bool]:
    @functools.wraps(original)
    def is_fx_symbolic_tracing() -> bool:
        holder = _holder
        if _enabled and holder is not None and holder != threading.get_ident():
            return False  # the process-wide flag is another thread's trace
        return original()

    is_fx_symbolic_tracing.__aitune_fx_trace_lock__ = True  # type: ignore[attr-defined]
    return is_fx_symbolic_tracing


def _tracing_thread_only(original: Callable[..., Any], elsewhere: Callable[..., Any]) -> Callable[..., Any]:
    """`original` on the thread that traces; `elsewhere(*args)` on every other thread while a trace holds the lock."""
    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        holder = _holder
        if _enabled and holder is not None and holder != threading.get_ident():
            return elsewhere(*args, **kwargs)
        return original(self, *args, **kwargs)

    method.__aitune_fx_trace_lock__ = True  # type: ignore[attr-defined]
    return method


def _plain_call(module: Any, forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    return forward(*args, **kwargs)  # (FX's `forward` here is the module's own `Module.__call__`)


def _plain_attribute(attr: str, attr_val: Any, parameter_proxy_cache: Any = None) -> Any:
    return attr_val


#: FX's methods that its patched `Module.__call__` / `__getattr__` call, and what another thread gets instead
_PASS_THROUGH = {"call_module": _plain_call, "getattr": _plain_attribute}


def _ours(value: Any) -> bool:
    """`value` is this module's wrapper, or a wrapper made with `functools.wraps` around it (dynamo wraps
    `Tracer.trace` once, whatever it is then; `wraps` copies the marker)."""
    return bool(getattr(value, "__aitune_fx_trace_lock__", False))


def install() -> None:
    """Serialize `torch.fx.Tracer.trace` across threads and make FX's tracing flag the tracing thread's (idempotent).

    Dynamo wraps `Tracer.trace` in a wrapper of its own the first time it compiles; when that happens after this
    patch, the patch stays inside dynamo's wrapper and `uninstall` can only switch it off (`_enabled`)."""
    global _enabled
    with _state_lock:
        _enabled = True
        if not _ours(torch.fx.Tracer.trace):
            _patches.append(Patch(torch.fx.Tracer, "trace", _serialized(torch.fx.Tracer.trace)).apply())
        for name, elsewhere in _PASS_THROUGH.items():
            current = getattr(torch.fx.Tracer, name, None)
            if current is not None and not _ours(current):
                _patches.append(Patch(torch.fx.Tracer, name, _tracing_thread_only(current, elsewhere)).apply())
        flag = getattr(fx_symbolic_trace, "is_fx_symbolic_tracing", None)
        if flag is not None and not _ours(flag):
            _patches.append(Patch(fx_symbolic_trace, "is_fx_symbolic_tracing", _this_threads_flag(flag)).apply())


def uninstall() -> None:
    """Switch the wrappers off and put torch's functions back where nobody wrapped them since (`Patch.restore`)."""
    global _enabled
    with _state_lock:
        _enabled = False
        while _patches:
            _patches.pop().restore()


def installed() -> bool:
    return _enabled
