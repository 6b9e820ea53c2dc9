"""Give torch's stand-in CUDA device guard a thread that lives as long as the tuning, where no CUDA device exists.

Why: on a CUDA build of torch on a machine with no CUDA device (what a plain `pip install torch` gives a CPU
server), every dynamo trace enters `FakeTensorMode`, which calls `torch._C._ensureCUDADeviceGuardSet()`. That puts
a stand-in CUDA guard into torch's process-wide registry of device guards, but the stand-in is a `thread_local`
of the calling thread (c10 `DeviceGuardImplInterface.cpp`, torch 2.11). When that thread ends, the registry points
at freed memory, and the next trace, on any thread, crashes the process with SIGSEGV. Every tuning job runs on a
thread of its own, so the job after the first one crashed the program (seen on this project's CPU with Python 3.12
and torch 2.11+cu130: a serving loop re-tuning a wider batch range).

`pin()`, before the first trace, makes the first call on the main thread, or, called from another thread, on a
daemon keeper thread that waits for the process's end: the stand-in it installs outlives every job thread, and
torch's later calls find it in place (it reports a device) and keep it. Where a CUDA device exists, or on torch
builds without the call, nothing is done.
"""

from __future__ import annotations

import logging
import threading

import torch

_logger = logging.getLogger("aitune.jit")

_lock = threading.Lock()
_pinned = False


def needed() -> bool:
    """True where a trace would install the thread-local stand-in: torch has the call and no CUDA device answers
    (FakeTensorMode's own test: `avoid_device_init`)."""
    if not hasattr(torch._C, "_ensureCUDADeviceGuardSet"):
        return False
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and getattr(xpu, "_is_compiled", lambda: False)():
        return False  # (an XPU build's FakeTensorMode does not make the call)
    return not torch.cuda.is_available()


def pin() -> None:
    """Install the stand-in, once per process, on a thread that lives until the process ends: this one if it is
    the main thread, else a keeper thread (waited for at most `KEEPER_WAIT_S`). A failure is logged at DEBUG:
    torch then installs the stand-in itself, as before."""
    global _pinned
    if _pinned:
        return
    with _lock:
        if _pinned:
            return
        _pinned = True
        if not _needed_quietly():
            return
        if threading.current_thread() is threading.main_thread():
            _install()
            return
        installed = threading.Event()
        try:
            threading.Thread(target=_keep, args=(installed,), name="aitune-device-guard", daemon=True).start()
        except RuntimeError:  # (the interpreter is shutting down: no trace follows)
            _logger.debug("could not start the device-guard keeper thread", exc_info=True)
            return
    installed.wait(KEEPER_WAIT_S)


#: how long `pin` waits for the keeper thread to install the stand-in (seconds)
KEEPER_WAIT_S = 5.0


def _needed_quietly() -> bool:
    try:
        return needed()
    except Exception:  # (a broken CUDA set-up: torch's trace meets it, not this)
        _logger.debug("could not tell whether a CUDA device exists", exc_info=True)
        return False


def _install() -> None:
    try:
        torch._C._ensureCUDADeviceGuardSet()
        _logger.debug("torch's stand-in CUDA device guard installed on thread %s", threading.current_thread().name)
    except Exception:
        _logger.debug("could not install torch's stand-in CUDA device guard", exc_info=True)


def _keep(installed: threading.Event) -> None:
    """The keeper thread: install, then wait forever (the stand-in lives as long as this thread)."""
    _install()
    installed.set()
    threading.Event().wait()


def pinned() -> bool:
    """True once `pin` has run (whether or not the stand-in was needed)."""
    return _pinned
