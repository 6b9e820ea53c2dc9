"""What a tuned node still owes the worker: packages to make, graphs to upgrade; a job settles them."""

from __future__ import annotations

from types import MappingProxyType

from aitune_jit.follow_ups import FollowUps
from aitune_jit.outcome import TuningOutcome


def test_an_outcome_adds_what_it_owes_and_removes_what_it_settled():
    follow = FollowUps()
    assert not follow.pending()
    spec = object()
    follow.note(TuningOutcome.unchanged(package_due=MappingProxyType({"0": ("k0", spec)}),
                                        upgrade_due=frozenset({"1"})))
    assert follow.pending() and follow.package == {"0": ("k0", spec)} and follow.upgrade == {"1"}
    before = follow.snapshot()
    follow.note(TuningOutcome.unchanged(upgraded=frozenset({"1"})))
    assert follow.upgrade == set() and follow.snapshot() != before
    follow.note(TuningOutcome.unchanged(packaged=frozenset({"0"})))
    assert not follow.pending()


def test_an_upgrade_owed_again_by_the_same_outcome_stays_owed_and_clear_forgets_everything():
    follow = FollowUps()
    follow.note(TuningOutcome.unchanged(upgraded=frozenset({"0"}), upgrade_due=frozenset({"0"})))
    assert follow.upgrade == {"0"}  # a re-tune that warm-started again owes its upgrade again
    follow.package["1"] = ("k1", object())
    follow.clear()
    assert not follow.pending() and follow.snapshot() is None


def test_a_graph_whose_backend_was_replaced_owes_nothing_for_its_old_spec():
    follow = FollowUps()
    assert follow.snapshot() is None  # nothing owed
    old_spec, new_spec = _Spec("0"), _Spec("0")
    follow.package["0"] = ("k-old", old_spec)
    follow.note(TuningOutcome.tuned([(new_spec, object())], []))  # re-tuned over wider ranges, owing nothing new
    assert follow.package == {}


class _Spec:
    def __init__(self, name: str) -> None:
        self.name = name
