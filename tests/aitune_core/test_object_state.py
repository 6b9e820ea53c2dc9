"""aitune_core/recording/object_state.py: iterators and in-memory streams by what a call moves in them, read
without moving it; other objects have no state here."""

from __future__ import annotations

import io
import itertools
import sys

import pytest

from aitune_core.recording.object_state import object_state


def _moved(value, move) -> bool:
    before = object_state(value)
    again = object_state(value)
    assert before is not None and before == again  # (reading it twice moves nothing)
    move(value)
    return object_state(value) != before


def _generator():
    count = 0
    while True:
        yield count
        count += 1


@pytest.mark.parametrize("value, move", [
    (itertools.count(3), next),
    (iter([1, 2, 3]), next),
    (iter(range(10)), next),
    (iter({"a": 1, "b": 2}.items()), next),
    (io.StringIO(), lambda s: s.write("line\n")),
    (io.BytesIO(), lambda s: s.write(b"x")),
    (_generator(), next),
], ids=["count", "list", "range", "dict-items", "text", "bytes", "generator"])
def test_a_move_changes_the_state_and_reading_does_not(value, move):
    assert _moved(value, move)


def test_a_generator_that_yields_from_one_place_is_told_by_its_locals():
    gen = _generator()
    next(gen)
    first = object_state(gen)
    next(gen)  # (the same yield, another count)
    assert object_state(gen) != first
    gen.close()
    assert object_state(gen) == ("generator", "finished")


def test_other_objects_and_unreadable_streams_have_no_state():
    closed = io.StringIO()
    closed.close()
    for value in (object(), [1], closed, sys.stderr):
        assert object_state(value) is None


def test_an_iterator_whose_state_cannot_be_read_reads_as_changed_only_when_asked():
    for value in (itertools.cycle([1]), itertools.islice(itertools.count(), 0, None), map(str, [1]), zip([1], [2])):
        assert object_state(value, unreadable=True) != object_state(value, unreadable=True)
        assert object_state(value) is None  # (a global of the forward's file: compared by identity, as before)


def test_a_queue_and_a_generator_keeping_a_list_counter():
    import queue

    q: queue.Queue = queue.Queue()
    assert _moved(q, lambda v: v.put(1))

    def counting():
        box = [0]
        while True:
            box[0] += 1
            yield box[0]

    gen = counting()
    next(gen)
    assert _moved(gen, next)
