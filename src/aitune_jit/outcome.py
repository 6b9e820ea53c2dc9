"""`TuningOutcome`: what one tuning of a node decided, handed to the node, which applies it in one step.

Why: the tuner reads a node and decides; only the node changes itself. The background worker computes an outcome
on its job thread and the node applies it between two calls (the dispatcher is complete before the state says
TUNED), so each call sees the node before or after, never half of it. `TuningNode` is what the tuner, the
decisions and the worker may see of a node (`PatchedModule` is one), so none of them names the node's class.

Verdicts (`PatchedModule.apply` has one handler per verdict):

    TUNED      these graphs run through their backends (the subtree detaches on the node's first success)
    EAGER      the node runs its original forward from now on; its children stay as they are
    DESCEND    the node runs its original forward; its children become candidates (tuned instead of it)
    DRY_RUN    nothing is tuned: the node and its subtree are left as they are (`jit_config.dry_run`)
    UNCHANGED  nothing switches: only graphs that failed (they run eagerly) and re-tunes that ran are noted
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from aitune_core.backends.backend import Backend
    from aitune_core.recording.graph_recorder import GraphRecorder
    from aitune_core.specs.graph_spec import GraphSpec
    from aitune_core.strategies.strategy import TuneReport
    from aitune_jit.state import NodeState

_logger = logging.getLogger("aitune.jit")


class Verdict(enum.Enum):
    TUNED = "tuned"
    EAGER = "eager"
    DESCEND = "descend"
    DRY_RUN = "dry_run"
    UNCHANGED = "unchanged"
    RECORD_AGAIN = "record_again"  # the recorded calls went stale (`stale_samples`): record them anew


@dataclasses.dataclass(frozen=True)
class TuningOutcome:
    """One tuning's decision (see the module docstring). `failed` (graph name -> why it runs eagerly), `retuned`
    (graphs whose re-tuning ran, whatever came of it), `checked` (graphs whose graph-break check ran) and the
    follow-ups (`follow_ups.py`: packages owed and made, upgrades owed and run) and `waiting` (graph name -> the
    other process tuning it and the spec it tunes: `replica_claims.py`) travel with every verdict."""

    verdict: Verdict
    reason: str | None = None
    entries: tuple[tuple[GraphSpec, Backend], ...] = ()
    reports: tuple[TuneReport, ...] = ()
    failed: Mapping[str, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    retuned: frozenset[str] = frozenset()
    checked: frozenset[str] = frozenset()
    package_due: Mapping[str, tuple[str, GraphSpec]] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    packaged: frozenset[str] = frozenset()
    upgrade_due: frozenset[str] = frozenset()
    upgraded: frozenset[str] = frozenset()
    waiting: Mapping[str, tuple[str, GraphSpec]] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    level: int = logging.INFO

    @classmethod
    def tuned(
        cls, entries: list[tuple[GraphSpec, Backend]], reports: list[TuneReport], **noted: object
    ) -> TuningOutcome:
        return cls(Verdict.TUNED, entries=tuple(entries), reports=tuple(reports), **noted)  # type: ignore[arg-type]

    @classmethod
    def eager(cls, reason: str, *, reopen: bool, level: int = logging.INFO, **noted: object) -> TuningOutcome:
        """The node stays eager for `reason`; with `reopen` its children are tuned instead (DESCEND)."""
        verdict = Verdict.DESCEND if reopen else Verdict.EAGER
        return cls(verdict, reason=reason, level=level, **noted)  # type: ignore[arg-type]

    @classmethod
    def record_again(cls, reason: str, **noted: object) -> TuningOutcome:
        """Nothing was decided: the recorded calls no longer describe the module; a new recording starts."""
        return cls(Verdict.RECORD_AGAIN, reason=reason, **noted)  # type: ignore[arg-type]

    @classmethod
    def dry_run(cls, message: str) -> TuningOutcome:
        return cls(Verdict.DRY_RUN, reason=message)

    @classmethod
    def unchanged(cls, **noted: object) -> TuningOutcome:
        return cls(Verdict.UNCHANGED, **noted)  # type: ignore[arg-type]

    def without_backends(self) -> TuningOutcome:
        """This outcome not switched to its backends (they are released): what is left to note is the failures
        and the re-tunes that ran."""
        self.release_backends()
        return TuningOutcome.unchanged(failed=self.failed, retuned=self.retuned, checked=self.checked,
                                       packaged=self.packaged, upgraded=self.upgraded, waiting=self.waiting)

    def release_backends(self) -> None:
        """Deactivate the backends built for this outcome, which no node will use."""
        for _spec, backend in self.entries:
            release_backend(backend)


def release_backend(backend: Backend) -> None:
    """Deactivate a backend no node uses (any more): failures are only logged, never hide an outcome."""
    try:
        if backend.is_active:
            backend.deactivate()
    except Exception:
        _logger.debug("Could not deactivate %s", backend.describe(), exc_info=True)


class TuningNode(Protocol):
    """What the tuner, the decisions and the worker see of a node (`PatchedModule`): they read it and hand it an
    outcome; they never change it otherwise."""

    path: str
    state: NodeState

    @property
    def short(self) -> str: ...

    @property
    def module(self) -> torch.nn.Module | None: ...

    @property
    def recorder(self) -> GraphRecorder | None: ...

    @property
    def retune_due(self) -> frozenset[str]: ...

    @property
    def checked_graphs(self) -> frozenset[str]: ...

    @property
    def upgrade_due(self) -> frozenset[str]: ...

    @property
    def package_due(self) -> Mapping[str, tuple[str, GraphSpec]]: ...

    @property
    def waited_specs(self) -> Mapping[str, GraphSpec]: ...

    def ready_graphs(self) -> list[GraphSpec]: ...

    def tuning_view(self) -> torch.nn.Module: ...

    def apply(self, outcome: TuningOutcome) -> None: ...

    def job_dropped(self) -> None: ...

    def reopen_after_fork(self) -> None: ...

    def give_up(self, reason: str) -> None: ...


class OutcomeDraft:
    """What one tuning found so far (the tuner and the known decisions add to it); the outcome is made from it
    once the tuning knows its verdict."""

    def __init__(self) -> None:
        self.entries: list[tuple[GraphSpec, Backend]] = []
        self.reports: list[TuneReport] = []
        self.failed: dict[str, str] = {}
        self.retuned: set[str] = set()
        self.checked: set[str] = set()
        self.package_due: dict[str, tuple[str, GraphSpec]] = {}
        self.packaged: set[str] = set()
        self.upgrade_due: set[str] = set()
        self.upgraded: set[str] = set()
        self.stale: set[str] = set()  # graphs whose recorded calls no longer match the module
        self.waiting: dict[str, tuple[str, GraphSpec]] = {}  # graphs another process tunes -> (which, spec)

    def _noted(self) -> dict[str, object]:
        return {"failed": MappingProxyType(dict(self.failed)), "retuned": frozenset(self.retuned),
                "checked": frozenset(self.checked), "package_due": MappingProxyType(dict(self.package_due)),
                "packaged": frozenset(self.packaged), "upgrade_due": frozenset(self.upgrade_due),
                "upgraded": frozenset(self.upgraded), "waiting": MappingProxyType(dict(self.waiting))}

    def eager(self, reason: str, *, reopen: bool) -> TuningOutcome:
        return TuningOutcome.eager(reason, reopen=reopen, **self._noted())

    def record_again(self, reason: str) -> TuningOutcome:
        noted = self._noted()
        noted["failed"] = MappingProxyType({})  # (nothing failed for good: the graphs are recorded anew)
        return TuningOutcome.record_again(reason, **noted)

    def finish(self) -> TuningOutcome:
        """TUNED with the backends found, or UNCHANGED when there are none."""
        if self.entries:
            return TuningOutcome.tuned(self.entries, self.reports, **self._noted())
        return TuningOutcome.unchanged(**self._noted())
