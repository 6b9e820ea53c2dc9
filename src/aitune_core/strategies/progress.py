"""`progress(message)`: a tuning step shown while it runs, and named for `current_phase()`.

Why: a long build or measurement should show that something happens (a rich spinner on stderr, only when stderr is
a terminal; `AITUNE_PROGRESS=0` turns it off), and a program or a probe that sees a slow request while a
background job runs can tell which step shared the machine with it (`benchmarks/probes/background_tuning.py`
reports latencies per step).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

PROGRESS_ENV = "AITUNE_PROGRESS"


def _progress_enabled() -> bool:
    if os.environ.get(PROGRESS_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    try:
        return bool(sys.stderr is not None and sys.stderr.isatty())
    except Exception:
        return False


@contextmanager
def progress(message: str) -> Iterator[None]:
    """A rich spinner on stderr while the block runs - only when stderr is a terminal - and the step named for
    `current_phase()`."""
    before = _phase[0]
    _phase[0] = message
    try:
        yield from _shown(message)
    finally:
        _phase[0] = before


#: the step a strategy is in now (`progress`), any thread's
_phase: list[str | None] = [None]


def current_phase() -> str | None:
    """The step of the tuning that runs now ("Building ...", "Validating ...", "Profiling ..."; None between steps).
    Why: a program or a probe that sees a slow request while a background job runs can tell which step shared the
    machine with it (`benchmarks/probes/background_tuning.py` reports latencies per step)."""
    return _phase[0]


def _shown(message: str) -> Iterator[None]:
    if not _progress_enabled():
        yield
        return
    try:
        from rich.console import Console

        status = Console(stderr=True).status(message)
    except Exception:
        yield
        return
    with status:
        yield
