"""Logging helpers: the `aitune` logger hierarchy and the pieces of aitune's log layout.

Library code never prints. It logs through `get_logger(area)` (a child of the `aitune` logger),
uses `SEPARATOR` / `THIN_SEPARATOR` for the thick and thin rules between tuning steps, `timed(...)`
for the "⏱️ ... completed in 1.90min" lines, and `render_to_str(...)` to turn rich renderables
(spec tables) into plain text that can go into a log record.

`install_stderr_warnings()` is for entry points that switch aitune on in a script that knows nothing about it
(the JIT's environment variable, import line, decorator and launcher): a library must not configure logging,
so the `aitune` logger only has a `NullHandler`, and its WARNINGs (a backend that failed, a module kept eager)
would vanish. The function adds one stderr handler at WARNING to the `aitune` logger, unless the application
configured logging (the root logger or the `aitune` logger has a handler); the handler also stays silent from
the moment the application configures logging later, so no record is shown twice. It shows each cause once:
records with the same `aitune_cause` attribute (`logger.warning(..., extra={"aitune_cause": key})`), or else
the same logger and message, are shown the first time only.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

ROOT_LOGGER_NAME = "aitune"
SEPARATOR = "═" * 64
THIN_SEPARATOR = "-" * 60
RENDER_WIDTH = 160

STDERR_FORMAT = "[aitune] %(levelname)s: %(message)s"
#: the `aitune` logger's level in a program switched on from outside (`quiet_progress`), e.g. INFO or DEBUG
LEVEL_ENV = "AITUNE_LOG_LEVEL"
#: distinct causes remembered by the stderr handler; beyond that, repeats may show again
MAX_CAUSES = 10_000

# A library must not configure logging, but must not emit "No handlers could be found" either.
logging.getLogger(ROOT_LOGGER_NAME).addHandler(logging.NullHandler())


def get_logger(area: str | None = None) -> logging.Logger:
    """Logger for one area of the code: `get_logger("backend")` -> logger `aitune.backend`.

    A name that already starts with `aitune` is used as is, so `get_logger(__name__)` works too
    (module names under `aitune_core` are mapped to `aitune.core....`).
    """
    if not area:
        return logging.getLogger(ROOT_LOGGER_NAME)
    if area == ROOT_LOGGER_NAME or area.startswith(ROOT_LOGGER_NAME + "."):
        return logging.getLogger(area)
    if area.startswith("aitune_"):
        # aitune_core.specs.graph_spec -> aitune.core.specs.graph_spec
        return logging.getLogger(ROOT_LOGGER_NAME + "." + area[len("aitune_"):])
    return logging.getLogger(f"{ROOT_LOGGER_NAME}.{area}")


def log_separator(logger: logging.Logger, *, thin: bool = False, level: int = logging.INFO) -> None:
    """Log the thick (`═`*64) or thin (`-`*60) separator line."""
    logger.log(level, THIN_SEPARATOR if thin else SEPARATOR)


def format_duration(seconds: float) -> str:
    """Human duration as in the tuning logs: `1.90min`, `19.70s`, `47.56ms`."""
    if seconds >= 60.0:
        return f"{seconds / 60.0:.2f}min"
    if seconds >= 1.0:
        return f"{seconds:.2f}s"
    return f"{seconds * 1000.0:.2f}ms"


@dataclass
class Timer:
    """What `timed` yields: `elapsed` seconds, filled in when the block exits."""

    elapsed: float | None = None


@contextmanager
def timed(logger: logging.Logger, label: str | None = None, *, level: int = logging.INFO) -> Iterator[Timer]:
    """Time a block and log `⏱️ <label>: completed in <duration>` (or `⏱️ completed in ...` without a label).

    The line is logged even when the block raises, so a failed step still shows how long it took.
    """
    timer = Timer()
    start = time.perf_counter()
    try:
        yield timer
    finally:
        timer.elapsed = time.perf_counter() - start
        prefix = f"⏱️ {label}: completed in" if label else "⏱️ completed in"
        logger.log(level, "%s %s", prefix, format_duration(timer.elapsed))


def render_to_str(renderable: Any, *, width: int = RENDER_WIDTH) -> str:
    """Render a rich renderable (table, group, text) to plain text without colours or control codes."""
    from rich.console import Console  # rich is a hard dependency; imported here to keep `import` cheap

    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width,
        no_color=True,
        color_system=None,
        force_terminal=False,
        force_jupyter=False,
        highlight=False,
        emoji=False,
        soft_wrap=False,
        legacy_windows=False,
    )
    console.print(renderable)
    return buffer.getvalue().rstrip("\n")


# ------------------------------------------------------------------------------------------------ stderr
def _application_configured(own: logging.Handler | None = None) -> bool:
    """True when the root logger, or the `aitune` logger, has a handler other than aitune's own ones."""
    if logging.getLogger().handlers:
        return True
    return any(
        handler is not own and not isinstance(handler, logging.NullHandler | StderrWarningHandler)
        for handler in logging.getLogger(ROOT_LOGGER_NAME).handlers
    )


class StderrWarningHandler(logging.StreamHandler):
    """WARNINGs of the `aitune` logger on the current `sys.stderr`, once per cause; see the module docstring."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setLevel(logging.WARNING)
        self.setFormatter(logging.Formatter(STDERR_FORMAT))
        self._seen: set[Any] = set()
        self._seen_lock = threading.Lock()

    def _first_time(self, record: logging.LogRecord) -> bool:
        key = getattr(record, "aitune_cause", None)
        if key is None:
            key = (record.name, record.levelno, record.getMessage())
        with self._seen_lock:
            if key in self._seen:
                return False
            if len(self._seen) < MAX_CAUSES:
                self._seen.add(key)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        if _application_configured(self) or not self._first_time(record):
            return
        self.stream = sys.stderr  # the stream of the moment (tests and tools replace sys.stderr)
        super().emit(record)


def install_stderr_warnings() -> StderrWarningHandler | None:
    """Show the `aitune` logger's WARNINGs on stderr in a script that did not configure logging (idempotent).

    Returns the handler (the one already installed, if any), or None when the application configured logging.
    """
    logger = logging.getLogger(ROOT_LOGGER_NAME)
    for handler in logger.handlers:
        if isinstance(handler, StderrWarningHandler):
            return handler
    if _application_configured():
        return None
    handler = StderrWarningHandler()
    logger.addHandler(handler)
    return handler


_quieted = [False]  # `quiet_progress` set the `aitune` logger's level (and `restore_progress` may undo it)


def quiet_progress() -> None:
    """Keep aitune's INFO progress lines out of a program that did not ask for them (idempotent).

    Why: a script switched on from outside (the JIT's environment variable, import line, decorator, launcher)
    knows nothing of aitune; if it logs at INFO through the root logger (`logging.basicConfig(level=INFO,
    stream=sys.stdout)`), the `aitune.*` records would propagate into its own output, dozens of lines the plain
    run never printed. So the `aitune` logger gets level WARNING, unless the program set a level on it itself;
    `AITUNE_LOG_LEVEL` (a level name: INFO, DEBUG) asks for the progress lines again. WARNINGs (a backend that
    failed, the exit summary) still reach the program's handlers or aitune's stderr handler.
    """
    logger = logging.getLogger(ROOT_LOGGER_NAME)
    wanted = os.environ.get(LEVEL_ENV, "").strip().upper()
    if wanted:
        level = logging.getLevelName(wanted)
        if isinstance(level, int):
            logger.setLevel(level)
            return
        logger.warning("%s=%r is not a logging level name (DEBUG, INFO, WARNING, ERROR); using WARNING",
                       LEVEL_ENV, wanted)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)
        _quieted[0] = True


def restore_progress() -> None:
    """Undo `quiet_progress` (the level it set, if the program did not change it since)."""
    logger = logging.getLogger(ROOT_LOGGER_NAME)
    if _quieted[0] and logger.level == logging.WARNING:
        logger.setLevel(logging.NOTSET)
    _quieted[0] = False


def remove_stderr_warnings() -> None:
    """Remove the handler `install_stderr_warnings` added (tests, and applications that want it gone)."""
    logger = logging.getLogger(ROOT_LOGGER_NAME)
    for handler in list(logger.handlers):
        if isinstance(handler, StderrWarningHandler):
            logger.removeHandler(handler)


def has_real_handler(logger: logging.Logger) -> bool:
    """True when a record of `logger` reaches a handler other than the `aitune` NullHandler."""
    current: logging.Logger | None = logger
    while current is not None:
        if any(not isinstance(handler, logging.NullHandler) for handler in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


def warn_visibly(logger: logging.Logger, message: str, *args: Any) -> None:
    """A WARNING the user must see even when the program configured no logging.

    The `aitune` NullHandler would swallow what Python prints by default for WARNING records (its
    `logging.lastResort` handler); without a real handler the message goes to stderr the way lastResort would
    print it. Never raises.
    """
    try:
        if not logger.isEnabledFor(logging.WARNING):
            return
        if has_real_handler(logger):
            logger.warning(message, *args)
            return
        import sys

        sys.stderr.write((message % args if args else message) + "\n")
    except Exception:  # a warning must never break the program
        pass
