"""`held_warnings(logger)`: a logger's WARNING records of this thread, held back until the caller knows whether
they are true.

Why: the strategy warns the moment a candidate fails ("❌ backend TorchInductorBackend(...) failed: ValidationError:
output differs from the original module's output"). In the JIT, such a failure may not be the backend's at all:
the program changed the module after its calls were recorded (reloaded weights, a buffer it rewrites before every
call), so every candidate differs from outputs that are stale. The tuner finds that out only after the strategy
has failed (`stale_samples.recorded_calls_stale`). A script whose program rewrote a schedule buffer before each
call printed two such WARNINGs blaming Inductor, which computed the right thing (seventh review, 2026-11-26).

How: while the block runs, a filter on the logger keeps this thread's WARNING-or-above records; `release()`
hands them on as they were, `demote()` logs them at DEBUG (the tuning history still has them). A candidate that
failed on a graph break is not a failure either: the tuner's graph-break check says why the graph stays eager,
in the history and the exit summary, and a WARNING mid-run blamed Inductor for a data-dependent `if` of the
model's (`demote(which)`). Records of other
threads, and below WARNING, pass as usual. On leaving the block, records neither released nor demoted are
released.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class HeldWarnings(logging.Filter):
    """The records held back (see the module docstring)."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__()
        self._logger = logger
        self._thread = threading.get_ident()
        self._held: list[logging.LogRecord] = []
        self._open = True

    def filter(self, record: logging.LogRecord) -> bool:
        if self._open and record.levelno >= logging.WARNING and threading.get_ident() == self._thread:
            self._held.append(record)
            return False
        return True

    def _close(self) -> list[logging.LogRecord]:
        self._open = False
        self._logger.removeFilter(self)
        held, self._held = self._held, []
        return held

    def release(self) -> None:
        """The held records, logged now as they were."""
        for record in self._close():
            self._logger.handle(record)

    def demote(self, which: Callable[[logging.LogRecord], bool] | None = None) -> None:
        """The held records, logged at DEBUG (they were not what they said); with `which`, only those it picks,
        and the others are released as they were."""
        for record in self._close():
            if which is not None and not which(record):
                self._logger.handle(record)
                continue
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
            if self._logger.isEnabledFor(logging.DEBUG):
                self._logger.handle(record)


@contextmanager
def held_warnings(logger: logging.Logger) -> Iterator[HeldWarnings]:
    """Hold this thread's WARNING records of `logger` while the block runs (see the module docstring)."""
    held = HeldWarnings(logger)
    logger.addFilter(held)
    try:
        yield held
    finally:
        if held._open:
            held.release()
