"""Which queued node the background worker tunes next: the one with the largest expected gain.

Why: when a large root cannot be tuned, its children become candidates together (their graphs become ready in
the same calls), and with `jit_config.tuning_budget_s` only the first few may be tuned before the budget is
spent. The children that hold most of the model's work should get that budget, not the ones that happen to be
called first (a small embedding or projection before the blocks). The expected gain is estimated without a
measurement, from what the node already knows: its parameter count (the work of a transformer or UNet block
grows with its weights). Ties keep the queue's order, so of identical siblings the first queued is tuned first
and the others reuse its decision (`decisions.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def expected_gain(node: Any) -> float:
    """A node's expected gain from tuning (its parameter count; 0 when unknown); -1 for a node that only owes
    packages for later processes (`follow_ups.py`): it waits for every node that tunes."""
    if getattr(node, "packaging_only", False):
        return -1.0
    count = getattr(node, "num_parameters", 0)
    return float(count) if isinstance(count, int | float) else 0.0


def pick_next(gains: Sequence[float]) -> int:
    """Index of the largest gain, the earliest among equals (`gains` in queue order; not empty)."""
    best = 0
    for index, gain in enumerate(gains):
        if gain > gains[best]:
            best = index
    return best
