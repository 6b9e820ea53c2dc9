"""aitune_core/recording/value_fingerprint.py: what a fingerprint sees change, one level or several down."""

from __future__ import annotations

import collections
import logging
import types

import torch

from aitune_core.recording.value_fingerprint import ITEMS, contents_fingerprint, entries, fingerprint


def test_one_level_tensors_by_version_simple_values_by_value_and_nan_equal_to_itself():
    tensor = torch.zeros(3)
    before = fingerprint(tensor)
    tensor.add_(1)
    assert fingerprint(tensor) != before
    assert fingerprint(float("nan")) == fingerprint(float("nan"))
    log = [1]
    before = fingerprint(log)
    log[0] = 2  # one level sees the length only
    assert fingerprint(log) == before


def test_contents_see_a_write_inside_a_dict_a_list_a_deque_and_a_plain_object():
    state = {"steps": torch.zeros(()), "kv": [torch.zeros(2)], "ring": collections.deque([0, 1]),
             "meter": types.SimpleNamespace(n=0)}
    writes = [lambda: state["steps"].add_(1), lambda: state["kv"][0].mul_(2), lambda: state["ring"].append(2),
              lambda: setattr(state["meter"], "n", 1), lambda: state["kv"].__setitem__(0, torch.ones(2))]
    for write in writes:
        before = contents_fingerprint(state)
        write()
        assert contents_fingerprint(state) != before, write


def test_long_containers_are_read_at_both_ends_and_a_container_holding_itself_ends():
    items = list(range(10 * ITEMS))
    before = contents_fingerprint(items)
    items[-1] = -1
    assert contents_fingerprint(items) != before
    before = contents_fingerprint(items)
    items[len(items) // 2] = -1  # the middle of a long list is not read
    assert contents_fingerprint(items) == before
    looped: list = [1]
    looped.append(looped)
    assert contents_fingerprint(looped) == contents_fingerprint(looped)


def test_machinery_is_not_walked_into():
    logger = logging.getLogger("tests.value_fingerprint")
    holder = {"logger": logger}
    before = contents_fingerprint(holder)
    logger.isEnabledFor(logging.INFO)  # fills the logger's level cache
    assert contents_fingerprint(holder) == before


def test_entries_of_a_dict_each_by_one_level_and_keyed_by_simple_value_or_identity():
    key = object()
    seen: list[int] = []
    counts = {"calls": 0, key: seen}
    before = entries(counts)
    assert before == {"calls": fingerprint(0), ("object", id(key)): fingerprint(seen)}
    seen.append(1)
    counts["calls"] += 1
    after = entries(counts)
    assert after["calls"] != before["calls"] and after[("object", id(key))] != before[("object", id(key))]


def test_contents_see_a_counter_in_a_closure_and_in_a_slots_object():
    def make_counter():
        count = 0

        def tick() -> int:
            nonlocal count
            count += 1
            return count

        return tick

    class Stats:
        __slots__ = ("n", "unset")

        def __init__(self) -> None:
            self.n = 0

    tick, stats = make_counter(), Stats()
    state = {"tick": tick, "stats": stats}
    for write in (tick, lambda: setattr(stats, "n", stats.n + 1)):
        before = contents_fingerprint(state)
        write()
        assert contents_fingerprint(state) != before, write
    assert contents_fingerprint(state) == contents_fingerprint(state)  # (reading moves nothing)
