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
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

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

    def summary(self) -> str:
        """One line: how much was captured and the first line of it."""
        if not self.lines:
            return "torch logged nothing"
        first = self.lines[0].splitlines()[0][:200]
        total = len(self.lines) + self.dropped
        return f"torch logged {total} line(s) ({self.errors} at ERROR); first: {first}"


class _Collector(logging.Handler):
    def __init__(self, sink: CapturedLogs) -> None:
        super().__init__(logging.WARNING)
        self._sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = f"{record.levelname} {record.name}: {record.getMessage()}"
        except Exception:  # a record whose arguments do not format
            text = f"{record.levelname} {record.name}: {record.msg!r}"
        self._sink.add(text, record.levelno >= logging.ERROR)


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
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            yield captured
        for warning in caught:
            captured.add(f"{warning.category.__name__}: {warning.message}", False)
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers = handlers
            logger.propagate = propagate
