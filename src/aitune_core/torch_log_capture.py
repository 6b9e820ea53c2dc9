"""`capture_torch_logs()`: torch's own log records and Python warnings, captured while aitune probes a module.

Why: tuning traces and compiles a user's module several times (graph-break probe, warm-up of each candidate).
Dynamo and Inductor log what they retry or give up on - guard-creation retries, fake-tensor errors, "Dynamo
detected a call to ..." warnings - often at ERROR level with tracebacks, although the program is fine and
tuning carries on. Printed in the middle of a user's program, 30-70 lines of tracebacks read as a crash. While
the block runs, the handlers torch installed on its loggers (`torch`, `torch._dynamo`, `torch._inductor`, ...)
and Python's warning display are replaced by a collector; afterwards they are put back exactly, and the caller
decides where the collected lines go (aitune's history, a DEBUG log).

Only torch's loggers are redirected: the application's own logging is untouched. Records other threads emit on
torch's loggers while the block runs are collected too; that is the price of not changing torch's logger
configuration for good.

Warnings are collected from the capturing thread only, and the warning filters are left as the program set them.
A background job captures on its own thread while the program runs on; `warnings.catch_warnings` there (as
before) changed process-wide state: the program's warnings went into the job's collection while it ran, and
its filters were replaced (a program run with `-W error` saw no error from its own warning during tuning). Now
`warnings.showwarning` is wrapped while any capture runs (`_WarningRoute`): a warning shown on a capturing
thread goes to that thread's collection, any other goes to whatever `showwarning` was before. A warning the
program's filters turn into an error raises inside tuning, which then fails; the program is not affected. The
`catch_warnings` blocks torch's compile path enters on the capturing thread, and the filters it adds in them, stay
that thread's own (`thread_warnings.private_warnings`).

A process forked while a capture runs has no thread to end it: the child puts torch's handlers and
`warnings.showwarning` back at once (`os.register_at_fork`).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aitune_core.thread_warnings import forget_shown, private_warnings

#: at most this many lines are kept per capture (a compile can log thousands at DEBUG)
MAX_LINES = 200


@dataclass
class CapturedLogs:
    """What torch logged (and warned) while the block ran."""

    lines: list[str] = field(default_factory=list)
    errors: int = 0  # records at ERROR or above
    dropped: int = 0  # lines beyond MAX_LINES

    def add(self, line: str, is_error: bool) -> None:
        if is_error:
            self.errors += 1
        if len(self.lines) < MAX_LINES:
            self.lines.append(line)
        else:
            self.dropped += 1

    def add_warning(self, message: Any) -> None:
        """A `warnings.WarningMessage` shown on the capturing thread."""
        self.add(f"{message.category.__name__}: {message.message}", False)

    def summary(self) -> str:
        """One line: how much was captured and the first line of it."""
        if not self.lines:
            return "torch logged nothing"
        first = self.lines[0].splitlines()[0][:200]
        total = len(self.lines) + self.dropped
        return f"torch logged {total} line(s) ({self.errors} at error level); first: {first}"


class _Collector(logging.Handler):
    def __init__(self, sink: CapturedLogs) -> None:
        super().__init__(logging.WARNING)
        self._sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        """Kept as `name [level]: message`: the level in lower case after the logger's name, so a history line that
        quotes torch's record ("first: torch._guards [error]: Error while creating guard") does not read as an
        ERROR of the program's own log (a real-size BERT service's log under `AITUNE_JIT_PRINT_HISTORY` did)."""
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not format
            message = repr(record.msg)
        self._sink.add(f"{record.name} [{record.levelname.lower()}]: {message}", record.levelno >= logging.ERROR)


def _torch_loggers() -> list[logging.Logger]:
    manager = logging.Logger.manager
    names = [name for name in list(manager.loggerDict) if name == "torch" or name.startswith("torch.")]
    loggers = [logging.getLogger(name) for name in names]
    return [logger for logger in loggers if logger.handlers or not logger.propagate or logger.name == "torch"]


@contextmanager
def capture_torch_logs() -> Iterator[CapturedLogs]:
    """Collect torch's WARNING+ log records and Python warnings raised in the block instead of printing them."""
    captured = CapturedLogs()
    collector = _Collector(captured)
    saved: list[tuple[logging.Logger, list[logging.Handler], bool]] = []
    for logger in _torch_loggers():
        saved.append((logger, list(logger.handlers), logger.propagate))
        logger.handlers = [collector]
        logger.propagate = False
    _running.append(saved)
    try:
        with _ROUTE.to(captured), private_warnings(captured.add_warning):
            yield captured
    finally:
        _put_back(saved)
        if saved in _running:
            _running.remove(saved)


_running: list[list[tuple[logging.Logger, list[logging.Handler], bool]]] = []  # captures in progress, oldest first


def _put_back(saved: list[tuple[logging.Logger, list[logging.Handler], bool]]) -> None:
    for logger, handlers, propagate in saved:
        logger.handlers = handlers
        logger.propagate = propagate


class _WarningRoute:
    """`warnings.showwarning` while captures run: per thread, to its capture or to what was there before."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sinks: dict[int, CapturedLogs] = {}
        self._previous = None  # the `showwarning` this route wrapped
        self._installed = None  # the wrapper, while it is `warnings.showwarning`

    @contextmanager
    def to(self, sink: CapturedLogs) -> Iterator[None]:
        ident = threading.get_ident()
        with self._lock:
            outer = self._sinks.get(ident)
            self._sinks[ident] = sink
            if self._installed is None:
                self._previous = warnings.showwarning
                self._installed = self._show
                warnings.showwarning = self._installed
        try:
            yield
        finally:
            with self._lock:
                if outer is not None:
                    self._sinks[ident] = outer
                else:
                    del self._sinks[ident]
                if not self._sinks and self._installed is not None:
                    if warnings.showwarning is self._installed:  # (a showwarning set since is the program's: kept)
                        warnings.showwarning = self._previous
                    self._installed = self._previous = None

    def _show(self, message, category, filename, lineno, file=None, line=None) -> None:
        sink = self._sinks.get(threading.get_ident())
        if sink is not None:
            sink.add(f"{category.__name__}: {message}", False)
            forget_shown(message, category, filename, lineno)
            return
        previous = self._previous or warnings._showwarning_orig  # (removed meanwhile by another thread)
        previous(message, category, filename, lineno, file, line)


_ROUTE = _WarningRoute()


def _after_fork_in_child() -> None:
    """The child of a fork made during a capture: torch's handlers and `showwarning` as before it (newest capture
    first, so the oldest one's saved handlers, torch's own, are the last put back)."""
    global _ROUTE
    while _running:
        _put_back(_running.pop())
    route = _ROUTE
    if route._installed is not None and warnings.showwarning is route._installed:
        warnings.showwarning = route._previous
    _ROUTE = _WarningRoute()  # (a fresh lock: the parent's job thread may have held it at the fork)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
