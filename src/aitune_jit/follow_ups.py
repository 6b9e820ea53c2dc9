"""`FollowUps`: work the background worker still owes a tuned node after its outcome was applied.

Why: the outcome of a tuning switches the node at once; two things come after it and must not delay it:

- `package`: a graph tuned here whose decision has no package yet gets one made, for warm starts of
  later processes (`packaging.py`; graph name -> (decision key, the graph spec its backend serves));
- `upgrade`: a graph that a warm start serves from a package is built again with the decided backend, which then
  replaces it (the package runs without CUDA graphs and without dynamo's specialization, so it may be slower).

Upgrades are tuning (the graph is ready again, `PatchedModule.ready_graphs`); packages are made only when the
node has nothing left to tune, and the worker takes a node that only owes packages after every node that tunes
(`tuning_order.expected_gain`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aitune_core.specs.graph_spec import GraphSpec
    from aitune_jit.outcome import TuningOutcome


class FollowUps:
    """Per node: packages to make and graphs to upgrade (see the module docstring)."""

    __slots__ = ("package", "upgrade")

    def __init__(self) -> None:
        self.package: dict[str, tuple[str, GraphSpec]] = {}
        self.upgrade: set[str] = set()

    def snapshot(self) -> tuple[frozenset[str], frozenset[str]] | None:
        """What is owed now, None when nothing is (compared before and after a job: a job that owed something and
        settled none of it, e.g. with the tuning budget spent, ends the follow-ups instead of queueing forever)."""
        return (frozenset(self.package), frozenset(self.upgrade)) if self.pending() else None

    def pending(self) -> bool:
        return bool(self.package or self.upgrade)

    def note(self, outcome: TuningOutcome) -> None:
        """What an applied outcome owes (`package_due`, `upgrade_due`) and settled (`packaged`, `upgraded`)."""
        self.upgrade -= outcome.upgraded
        self.upgrade |= outcome.upgrade_due
        for name in outcome.packaged | {spec.name for spec, _backend in outcome.entries}:
            self.package.pop(name, None)  # made, or the graph's backend replaced: its old spec is owed nothing
        self.package.update(outcome.package_due)

    def clear(self) -> None:
        self.package.clear()
        self.upgrade.clear()
