"""One `sys.monitoring` callback on Python function starts, shared by the tuning jobs that run at once.

Why: a background job steps aside for requests at its Python function calls (`worker_yield`). A profile
function (`sys.setprofile`) would see those calls too, but it puts the interpreter in its slow mode for that
thread and reports every C call and return as well; `sys.monitoring` (Python 3.12 and later) calls back on
function starts only and leaves the rest of the interpreter as it is.

Monitoring events are process-wide: every thread's function starts reach the callback while it is installed,
so the callback must return at once on threads that are not gated (`worker_yield._on_function_start` does).
A callback may return `DISABLE` to hear no more of one function start (a job's free run, `worker_yield`), and
`restart` brings them all back. Jobs on several devices may run at once; the first `acquire` installs the
callback and the last `release` removes it. The callback takes a tool id that debuggers, coverage and profilers
leave free (3 or 4); when both are taken, or on an older Python, `acquire` returns False and the caller uses its
fallback.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

_logger = logging.getLogger("aitune.jit")

TOOL_NAME = "aitune-step-aside"
#: ids left free by the ones Python names (debugger 0, coverage 1, profiler 2, optimizer 5)
TOOL_IDS = (4, 3)

_lock = threading.Lock()
_users = 0
_tool: int | None = None
_callback: Callable[[Any, int], Any] | None = None


def available() -> bool:
    """True where this Python has `sys.monitoring`."""
    return hasattr(sys, "monitoring")


def acquire(callback: Callable[[Any, int], Any]) -> bool:
    """Have `callback(code, offset)` called at every Python function start until the matching `release`.
    All users share the first user's callback. False (nothing installed) where monitoring is missing or no tool
    id is free."""
    global _users, _tool, _callback
    if not available():
        return False
    with _lock:
        if _users:
            _users += 1
            return True
        tool = _claim_tool()
        if tool is None:
            return False
        monitoring = sys.monitoring
        monitoring.register_callback(tool, monitoring.events.PY_START, callback)
        monitoring.set_events(tool, monitoring.events.PY_START)
        _tool, _callback, _users = tool, callback, 1
        return True


def release() -> None:
    """Undo one `acquire` that returned True; the last one removes the callback and frees the tool id."""
    global _users, _tool, _callback
    with _lock:
        if _users <= 0:
            return
        _users -= 1
        if _users or _tool is None:
            return
        monitoring = sys.monitoring
        try:
            monitoring.set_events(_tool, monitoring.events.NO_EVENTS)
            monitoring.register_callback(_tool, monitoring.events.PY_START, None)
            monitoring.free_tool_id(_tool)
        except Exception:  # (a tool id freed by someone else meanwhile)
            _logger.debug("could not release monitoring tool %s", _tool, exc_info=True)
        _tool, _callback = None, None


def remove() -> None:
    """Remove the callback whatever the users' count (at exit, where a job thread may never get to `release`);
    a later `release` finds nothing to undo."""
    global _users
    with _lock:
        if _users:
            _users = 1
    release()


#: what the callback returns to have no more calls from the function start it was called at (until `restart`)
DISABLE = getattr(getattr(sys, "monitoring", None), "DISABLE", None)


def restart() -> None:
    """Have the callback called again at every function start where it returned `DISABLE`. Python's
    `restart_events` does this for every tool: a tool that had disabled events of its own (coverage) gets them
    again, once, and disables them again. It runs on the program's threads too (a request that ends a free run):
    a failure is logged at DEBUG, never raised into the program's call."""
    if available():
        try:
            sys.monitoring.restart_events()
        except Exception:
            _logger.debug("could not restart the monitoring events", exc_info=True)


#: a job's free run (`worker_yield`) until then: the callback returns `DISABLE` at the function starts it hears
muted_until = 0.0


def mute(until: float) -> None:
    """Until `until` the callback asks to hear no more of each function start it is at (`muted_until`); the
    first request, cancel or fork after it, or the first function start the callback still hears after it,
    calls `unmute`."""
    global muted_until
    muted_until = until


def unmute() -> None:
    """End a free run now: every disabled function start is heard again (`restart`)."""
    global muted_until
    if muted_until:
        muted_until = 0.0
        restart()


def installed() -> bool:
    """True while the callback is installed."""
    return _users > 0


def _claim_tool() -> int | None:
    monitoring = sys.monitoring
    for tool in TOOL_IDS:
        if monitoring.get_tool(tool) is not None:
            continue
        try:
            monitoring.use_tool_id(tool, TOOL_NAME)
        except ValueError:  # taken between the check and the claim
            continue
        return tool
    _logger.debug("no sys.monitoring tool id free among %s: the profile-function gate is used", TOOL_IDS)
    return None


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's job threads: their callback goes, and a lock one of them held at the
    fork is held by no thread here, so it is made anew first."""
    global _lock
    _lock = threading.Lock()
    unmute()
    remove()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
