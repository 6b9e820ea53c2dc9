"""Logging helpers: the `aitune` logger hierarchy and the pieces of the seed's log layout.

Library code never prints. It logs through `get_logger(area)` (a child of the `aitune` logger),
uses `SEPARATOR` / `THIN_SEPARATOR` for the thick and thin rules between tuning steps, `timed(...)`
for the "⏱️ ... completed in 1.90min" lines, and `render_to_str(...)` to turn rich renderables
(spec tables) into plain text that can go into a log record.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

ROOT_LOGGER_NAME = "aitune"
SEPARATOR = "═" * 64
THIN_SEPARATOR = "-" * 60
RENDER_WIDTH = 160

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
    """Human duration as in the seed's logs: `1.90min`, `19.70s`, `47.56ms`."""
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
