"""Cancelling a background job's thread when the program ends.

Why: a daemon thread still inside torch's C++ code when the interpreter finalizes aborts the process ("terminate
called without an active exception"), and one still running Python while the interpreter stops the main thread
crashed it (worker.py, "Exit"). So the worker cancels a running job before that and waits a bounded time.

How, in order:

1. At the job thread's next Python function start: the job's step-aside gate raises `TuningCancelled` there, once
   (`worker_yield._StepAside.cancel`). That is where the function itself could have raised, so the `finally`
   blocks and context managers it unwinds through (dynamo's, Inductor's, `threading`'s) run whole. Not while the
   thread captures a CUDA graph (an exception there ends the capture half-way inside torch's bookkeeping).
2. If that cancel has not been raised `COOPERATIVE_WAIT_S` later (a job without a gate, a thread inside a long C
   call or a loop that calls no Python function), or the thread still runs `UNWIND_WAIT_S` after it was raised
   (a cancel swallowed), an asynchronous exception (`PyThreadState_SetAsyncExc`), which Python raises at the
   thread's next bytecode wherever that is; sent again every `CANCEL_RESEND_S` while the thread runs, since one
   that lands in a weakref callback or a `__del__` is dropped there (`catch_unraisable_cancels`), and held back
   while the thread captures a CUDA graph. A thread that is unwinding from the first cancel is not sent one
   within `UNWIND_WAIT_S`: it would land in the cleanup code.
3. At the end of its body the cancelled thread does not end: it waits for the process to end (`rest_forever`).

Why 3: a ResNet-50 serving process that exits while its job re-tunes sometimes died with SIGSEGV at the first line
of `threading.Thread._stop`, in the worker's supervisor, right after the cancelled job thread ended: on H100s 3 of
10 before 928e0d1; on one H200 (Python 3.12.3, torch 2.11) 1 of 6 at dd04a3c and 1 of 18 at 4017794, where the
monitoring gates already stood down before the cancel, so the asynchronous exception cancelled the job as in the
gateless processes (docs/benchmarks.md, "The crash at exit, measured on an H200"). Python 3.12 runs garbage
collections at function starts, and `_stop`'s start is the first one after the thread's end: what the cancel left
behind can point into what the thread's end freed.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from aitune_jit import capture_guard

_logger = logging.getLogger("aitune.jit")

#: a cancel raised at a function start gets this long before the asynchronous exception follows (seconds)
COOPERATIVE_WAIT_S = 0.5
#: a thread unwinding from a cancel raised at a function start gets this long before an asynchronous one (seconds)
UNWIND_WAIT_S = 2.0
#: while waiting for a cancelled job's thread, the asynchronous cancel is sent again this often (seconds)
CANCEL_RESEND_S = 0.2


class TuningCancelled(BaseException):
    """Raised inside a job thread when the program ends: a BaseException, so the compiler's `except Exception`
    handlers let it through and the thread leaves torch's code before the interpreter finalizes."""


class CancellableJob(Protocol):
    abandoned: bool
    path: str
    thread: Any  # threading.Thread | None
    gate: Any  # the job's step-aside gate (worker_yield._StepAside) while it runs, else None
    cancel_sent: float | None
    finished: Any  # threading.Event: set when the job's body has returned


def cancel(job: CancellableJob) -> None:
    """Abandon `job` and cancel its thread (module docstring, step 1; step 2 where the thread has no gate)."""
    job.abandoned = True
    thread = job.thread
    if thread is None or thread.ident is None or job.finished.is_set():
        return
    if job.cancel_sent is None:
        job.cancel_sent = time.monotonic()
    gate = job.gate
    catch_unraisable_cancels()  # (a cancel raised at a function start can land in a finalizer too)
    if gate is not None and gate.cancel(TuningCancelled):
        return
    _send_async(job)


def join_cancelled(job: CancellableJob, deadline: float) -> None:
    """Wait until `deadline` for a cancelled job's body to return; past `COOPERATIVE_WAIT_S`, send the asynchronous
    cancel (again every `CANCEL_RESEND_S`) while it runs on. It waits on the job's `finished` event and never joins
    or polls the thread (`Thread.join` / `is_alive`): the worker's supervisor is already joining it, and two threads
    joining one thread as it ends race in `threading` (cpython issue 116372, fixed in 3.13)."""
    if job.thread is None:
        return
    while not job.finished.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            gate = job.gate
            if gate is None or not gate.cancel_raised:  # (the last chance: never leave it with no cancel at all)
                if gate is not None:
                    gate.withdraw_cancel()
                _send_async(job)
            return
        if job.finished.wait(min(CANCEL_RESEND_S, left)):
            return
        sent = job.cancel_sent if job.cancel_sent is not None else 0.0
        gate = job.gate
        unwinding = gate is not None and gate.cancel_raised
        if time.monotonic() - sent >= (UNWIND_WAIT_S if unwinding else COOPERATIVE_WAIT_S):
            if gate is not None:
                gate.withdraw_cancel()  # (it must not also raise while the asynchronous one unwinds)
            _send_async(job)


def _send_async(job: CancellableJob) -> None:
    thread = job.thread
    if thread is None or thread.ident is None or job.finished.is_set():
        return
    catch_unraisable_cancels()
    if not _raise_async(thread.ident):
        _logger.debug("could not cancel the tuning job of %s", job.path)


def _raise_async(ident: int) -> bool:
    """Raise `TuningCancelled` in thread `ident` - unless it is capturing a CUDA graph (sent again a moment later by
    `join_cancelled`). True when sent or deferred."""
    if capture_guard.capturing_in(ident):
        _logger.debug("the tuning job is capturing a CUDA graph: the cancel waits for the capture to end")
        return True
    try:
        import ctypes

        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(TuningCancelled))
    except Exception:  # no ctypes: the bounded wait is all there is
        return False
    return True


_previous_unraisablehook: Callable[[Any], Any] | None = None


def catch_unraisable_cancels() -> None:
    """An asynchronous cancel lands at whatever Python instruction the job thread runs next - sometimes a weakref
    callback or a `__del__` (importlib's module-lock callback, seen on this project's CPU), where Python cannot
    propagate it: it would print "Exception ignored in ..." and a traceback on the program's stderr. So can one
    a step-aside gate raises at a function start: a generator closed by the collector runs Python code there (a
    `TrainingSwitched` in torch's `tree_map` generator, a helper's script, sixth round). `sys.unraisablehook`
    drops such a cancel (any `TuningCancelled`) quietly (installed by every cancel unless it is in place; other
    unraisable exceptions go to the hook that was there). The exit's cancel is sent again by `join_cancelled`; a
    `TrainingSwitched` dropped so is not raised again (the gate that raised it is off by then on Python 3.11, and a
    cancel re-armed inside the hook is raised in the hook): that job goes on as it did before this hook, its
    validation replays in training mode (on the job's own random streams: `job_rng`)."""
    global _previous_unraisablehook
    if sys.unraisablehook is not _unraisable_cancel:  # (again if someone replaced it since)
        _previous_unraisablehook = sys.unraisablehook
        sys.unraisablehook = _unraisable_cancel


def _unraisable_cancel(unraisable: Any) -> None:
    try:  # (late in the interpreter's end this module's globals may be gone)
        exc_type = unraisable.exc_type
        ours = isinstance(exc_type, type) and issubclass(exc_type, TuningCancelled)
    except BaseException:  # (nothing may escape an unraisable hook)
        ours = False
    if ours:
        try:  # noqa: SIM105 - (a plain try: `suppress` runs Python code a cancel could land in)
            _logger.debug("a cancelled tuning job's %s landed in %r; dropped", exc_type.__name__, unraisable.object)
        except BaseException:  # (nothing may escape an unraisable hook)
            pass
        return
    previous = _previous_unraisablehook or sys.__unraisablehook__
    previous(unraisable)


#: held from import on and never released: a job thread that reaches the program's end waits on it for good
_never = threading.Lock()
_never.acquire()
_resting: set[int] = set()  # idents of the threads waiting there


def rest_forever() -> None:
    """Wait, without the GIL, until the process ends; called by a job thread at the program's end instead of
    ending (step 3 of the module docstring). A thread's end frees its frame stack and its thread-local state; what
    the cancel left behind (dynamo hands its callback a raw pointer to the frame it intercepts, and a traceback can
    keep the callback's frame alive) can still point there. A thread that never ends frees nothing. The caller
    holds no lock (the job body has unwound) and is a daemon thread; the exit path waits on the job's `finished`
    event, never on the thread."""
    while True:
        try:
            _resting.add(threading.get_ident())
            _never.acquire()  # (never woken: a daemon thread woken while the interpreter finalizes is forced out)
        except BaseException:  # (a cancel sent just before the job said it finished lands here: it changes nothing)
            continue


def release_logging_locks() -> None:
    """Release the `logging` locks the calling thread holds: the module's lock and each handler's. Called by a job
    thread as its body ends (before it says it finished). An asynchronous cancel can land between a lock's acquire
    and the `try` that releases it (logging's `isEnabledFor` takes the module lock on a cache miss); the thread then
    ended, or rested, holding it, and the program's next log call at exit waited for it for good (1 of 6 exits
    of `tests/aitune_jit/scripts/exit_while_tuning.py` hung in aitune's exit summary). Never raises."""
    locks = [getattr(logging, "_lock", None)]
    for ref in list(getattr(logging, "_handlerList", [])):
        handler = ref()
        if handler is not None:
            locks.append(handler.lock)
    for lock in locks:
        owned = getattr(lock, "_is_owned", None)
        try:
            while owned is not None and owned():
                lock.release()
        except Exception:  # (not an RLock after all: nothing to release)
            continue


def release_import_locks() -> None:
    """Release the import locks of modules (`importlib._bootstrap._ModuleLock`) the calling thread holds. Called
    with `release_logging_locks`, for the same reason: a job cancelled while it imported a module (Inductor's
    modules are imported on the job thread) rested holding that module's lock, and the program's own import of the
    module at exit waited for good (a GPT-2 serving script under `make test` hung in dynamo's exit report, which
    imports `tabulate`). Never raises."""
    bootstrap = sys.modules.get("importlib._bootstrap")
    me = threading.get_ident()
    for ref in list(getattr(bootstrap, "_module_locks", {}).values()):
        lock = ref() if callable(ref) else None
        try:
            while lock is not None and getattr(lock, "owner", None) == me:
                lock.release()
        except Exception:  # (released meanwhile, or another layout: nothing to do)
            continue
    release_global_import_lock()


def release_global_import_lock() -> None:
    """Release the interpreter's global import lock (`_imp.acquire_lock`) as often as the calling thread holds it.
    importlib takes it around each module lock's lookup and in that lock's weakref callback; a cancel that landed
    right after the acquire left a resting job thread holding it, and the program's import at exit (torch's
    compile-times report imports `tabulate`) waited for good: 3 of about 23 background runs of a helper's script
    on a loaded 2-core machine (sixth round), the main thread in `_get_module_lock`. Never raises."""
    import _imp

    for _ in range(64):  # (re-entrant: once per acquire; `release_lock` raises when this thread holds none)
        try:
            _imp.release_lock()
        except RuntimeError:
            return


def release_held_locks() -> None:
    """`release_logging_locks` and `release_import_locks`: what a job thread calls as its body ends, before it says
    it finished (a cancel can land after a lock's acquire and before the code that releases it). Never raises."""
    release_logging_locks()
    release_import_locks()


def resting(thread: Any) -> bool:
    """True when `thread` waits in `rest_forever`."""
    return thread.ident in _resting and thread.is_alive()


def keep_interrupt_exit_status() -> None:
    """A script that ends with an uncaught KeyboardInterrupt exits as if killed by SIGINT (status 130): CPython
    sets a flag when the script's code raised it and checks it after finalizing. Any `exec` or `eval` of a string
    clears that flag (CPython resets it before running such code), and a job thread compiling when the script
    ended runs such code (generated functions: dataclasses, Inductor's wrappers): the process exited with status 1.
    Called at the end of the exit cancel, once the jobs are stopped: when the script's exception was exactly
    KeyboardInterrupt, running code that raises it sets the flag again. Never raises."""
    last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if type(last) is not KeyboardInterrupt:
        return
    with contextlib.suppress(KeyboardInterrupt):
        exec("raise KeyboardInterrupt")  # (a constant string: the CPython path that sets the flag)
