"""`CallBacklog`: at most `depth` calls queued; tested with events whose completion the test decides."""

from __future__ import annotations

import pytest

from aitune_core.gpu_backlog import CallBacklog


class FakeEvent:
    """An event that ends when the test says so (`done`), or when waited for."""

    log: list[str]

    def __init__(self, name: str, log: list[str], done: bool = False) -> None:
        self.name, self.log, self.done = name, log, done

    def record(self) -> None:
        self.log.append(f"record {self.name}")

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.log.append(f"wait {self.name}")
        self.done = True


def test_the_call_depth_back_is_waited_for_before_the_next_is_queued():
    log: list[str] = []
    backlog = CallBacklog(depth=2)
    events = [FakeEvent(str(i), log) for i in range(4)]
    for event in events:
        backlog.before_call()
        log.append(f"call {event.name}")
        backlog.after_call(event)
    assert log == ["call 0", "call 1", "wait 0", "call 2", "wait 1", "call 3"]
    assert backlog.waits == 2


def test_a_call_that_already_ended_is_not_waited_for():
    log: list[str] = []
    backlog = CallBacklog(depth=1)
    backlog.after_call(FakeEvent("a", log, done=True))
    backlog.before_call()
    assert log == [] and backlog.waits == 0


def test_without_an_event_one_is_made_and_recorded_after_the_call():
    log: list[str] = []
    made = iter(FakeEvent(str(i), log) for i in range(3))
    backlog = CallBacklog(depth=1, make_event=lambda: next(made))
    for _ in range(3):
        backlog.before_call()
        backlog.after_call()
    assert log == ["record 0", "wait 0", "record 1", "wait 1", "record 2"]


def test_depth_zero_is_unbounded_and_makes_no_event():
    backlog = CallBacklog(depth=0, make_event=lambda: pytest.fail("no event is made"))
    for _ in range(5):
        backlog.before_call()
        backlog.after_call()
    assert backlog.waits == 0


def test_a_negative_depth_is_refused():
    with pytest.raises(ValueError, match="depth must be >= 0"):
        CallBacklog(depth=-1)
