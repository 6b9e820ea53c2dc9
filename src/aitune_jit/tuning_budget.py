"""`TuningBudget`: the seconds this process may spend tuning; once spent, modules not tuned yet stay eager.

Why: when a large root cannot be tuned, its children become candidates, and a deep model can have dozens of them
(an SD-1.5 UNet: 33 blocks tuned one after another, 330 s on an H100). `jit_config.tuning_budget_s` bounds what
tuning may cost a process in total; None (the default) leaves it unbounded. The time of every tuning pass counts,
whatever its outcome; a pass already running is never cut short.
"""

from __future__ import annotations

import threading

from aitune_jit.config import jit_config


class TuningBudget:
    """Seconds spent tuning in this process, against `jit_config.tuning_budget_s`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spent_s = 0.0

    def exhausted(self) -> str | None:
        """Why no more tuning may start (the budget is spent), or None."""
        budget = jit_config.tuning_budget_s
        if budget is None or self.spent_s < budget:
            return None
        return (
            f"the tuning budget of this process is spent ({self.spent_s:.0f} s of "
            f"jit_config.tuning_budget_s={budget:g})"
        )

    def charge(self, seconds: float) -> None:
        with self._lock:
            self.spent_s += max(0.0, seconds)

    def reset(self) -> None:
        with self._lock:
            self.spent_s = 0.0


#: the process-wide budget
budget = TuningBudget()
