"""The worker's tuning knobs read from the environment (`AITUNE_WORKER_*`), one way for all of them.

Why: they are read when a job starts, not at import (a test or a launcher may set them later), and a wrong value
must neither stop the job nor pass silently: it gets one WARNING naming the variable and the default used.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence

_logger = logging.getLogger("aitune.jit")


def env_choice(name: str, choices: Sequence[str], default: str) -> str:
    """`name`'s value (case and spaces ignored) if it is one of `choices`, else `default`."""
    text = os.environ.get(name, default).strip().lower()
    if text not in choices:
        _logger.warning("%s=%r is none of %s; using %s", name, text, ", ".join(choices), default)
        return default
    return text


def env_number(name: str, default: float) -> float:
    """`name` as a number, `default` when unset or not a number (then with a warning)."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):  # (nan and inf too: an infinite wait overflowed the timers, and nothing was tuned)
        _logger.warning("%s=%r is not a finite number; using %g", name, text, default)
        return default
    return value
