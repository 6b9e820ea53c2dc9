"""`TuningOutcome`: verdicts, what travels with every verdict, and backends released when an outcome is dropped."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from aitune_jit.outcome import OutcomeDraft, TuningOutcome, Verdict, release_backend


class _Backend:
    def __init__(self, fails: bool = False) -> None:
        self.is_active = True
        self.fails = fails

    def deactivate(self) -> None:
        if self.fails:
            raise RuntimeError("cannot deactivate")
        self.is_active = False

    def describe(self) -> str:
        return "fake"


class _Spec:
    def __init__(self, name: str) -> None:
        self.name = name


def test_eager_says_whether_the_children_are_tuned_instead():
    assert TuningOutcome.eager("graph break", reopen=True).verdict is Verdict.DESCEND
    kept = TuningOutcome.eager("too cheap", reopen=False, level=logging.WARNING)
    assert kept.verdict is Verdict.EAGER and kept.reason == "too cheap" and kept.level == logging.WARNING
    assert TuningOutcome.dry_run("would tune").verdict is Verdict.DRY_RUN
    assert TuningOutcome.unchanged().failed == {} and TuningOutcome.unchanged().entries == ()


def test_an_outcome_is_frozen():
    outcome = TuningOutcome.unchanged()
    with pytest.raises(dataclasses.FrozenInstanceError):
        outcome.reason = "changed"  # type: ignore[misc]


def test_the_draft_makes_a_snapshot_tuned_with_backends_else_unchanged():
    draft = OutcomeDraft()
    draft.failed["1"] = "graph break"
    draft.retuned.add("0")
    draft.checked.add("1")
    unchanged = draft.finish()
    assert unchanged.verdict is Verdict.UNCHANGED
    assert dict(unchanged.failed) == {"1": "graph break"} and unchanged.retuned == {"0"} and unchanged.checked == {"1"}
    backend: Any = _Backend()
    draft.entries.append((_Spec("0"), backend))
    draft.reports.append("report")  # type: ignore[arg-type]
    tuned = draft.finish()
    draft.failed["2"] = "later"
    assert tuned.verdict is Verdict.TUNED and [b for _s, b in tuned.entries] == [backend]
    assert "2" not in tuned.failed and "2" not in unchanged.failed  # the outcome does not follow the draft
    eager = draft.eager("nothing could be tuned", reopen=True)
    assert eager.verdict is Verdict.DESCEND and eager.failed["2"] == "later"


def test_an_outcome_without_its_backends_releases_them_and_keeps_what_it_noted():
    kept, broken = _Backend(), _Backend(fails=True)
    outcome = TuningOutcome.tuned([(_Spec("0"), kept), (_Spec("1"), broken)], [], failed={"2": "x"},  # type: ignore[list-item]
                                  retuned=frozenset({"0"}))
    left = outcome.without_backends()
    assert not kept.is_active and broken.is_active  # a failing deactivate is only logged
    assert left.verdict is Verdict.UNCHANGED and left.entries == ()
    assert dict(left.failed) == {"2": "x"} and left.retuned == {"0"}


def test_release_backend_leaves_an_inactive_backend_alone():
    backend = _Backend()
    backend.is_active = False
    backend.fails = True  # would raise if deactivated
    release_backend(backend)  # type: ignore[arg-type]
    assert not backend.is_active
