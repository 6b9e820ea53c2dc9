"""The states a JIT node (`PatchedModule`) moves through, with the markers the hierarchy view prints.

    INIT ⏳       seen, waiting: an ancestor is still recording or being tuned
    RECORDING 🔴  a candidate: its calls are recorded until `min_samples` per graph
    TUNED 🎯      its forward runs through a validated backend (other graphs / shapes run eagerly)
    EAGER ⚠️      could not be tuned (graph break, every backend failed, none faster); children are candidates
    SKIPPED 🚫    excluded by configuration (skip_modules, min_parameters, max_depth_level, dry_run)
    DETACHED ☑️   inside the subtree of a tuned node (or of one whose children will never be candidates: a dry
                 run, an eager node with its children closed): unpatched, costs one lookup per call
"""

from __future__ import annotations

import enum


class NodeState(enum.Enum):
    INIT = "init"
    RECORDING = "recording"
    TUNED = "tuned"
    EAGER = "eager"
    SKIPPED = "skipped"
    DETACHED = "detached"

    @property
    def marker(self) -> str:
        return _MARKERS[self]

    def __str__(self) -> str:
        return f"{self.value}{self.marker}"


_MARKERS = {
    NodeState.INIT: "⏳",
    NodeState.RECORDING: "🔴",
    NodeState.TUNED: "🎯",
    NodeState.EAGER: "⚠️",
    NodeState.SKIPPED: "🚫",
    NodeState.DETACHED: "☑️",
}
