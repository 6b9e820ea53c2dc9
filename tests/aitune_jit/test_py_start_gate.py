"""aitune_jit/py_start_gate.py: one shared monitoring callback on function starts, installed by the first acquire,
removed by the last release, and a clean refusal where Python has no `sys.monitoring` or no tool id is free.
Torch-free: runs under `python3.12 -m pytest --noconftest` too (the 3.12 cases skip on older Pythons)."""

from __future__ import annotations

import sys
import threading

import pytest

from aitune_jit import py_start_gate

monitoring_only = pytest.mark.skipif(not py_start_gate.available(), reason="needs sys.monitoring (Python 3.12+)")


def _work() -> int:
    return 1


@pytest.mark.skipif(py_start_gate.available(), reason="this Python has sys.monitoring")
def test_older_pythons_get_false_and_nothing_installed():
    assert py_start_gate.acquire(lambda code, offset: None) is False
    assert not py_start_gate.installed()
    py_start_gate.release()  # (harmless without an acquire)


@monitoring_only
def test_function_starts_of_every_thread_reach_the_callback_until_the_last_release():
    seen = []

    def callback(code, offset):
        if code is _work.__code__:
            seen.append(threading.get_ident())

    assert py_start_gate.acquire(callback)
    assert py_start_gate.acquire(lambda code, offset: None)  # a second job shares the first callback
    try:
        _work()
        other = threading.Thread(target=_work)
        other.start()
        other.join()
        assert set(seen) == {threading.get_ident(), other.ident}
        py_start_gate.release()
        assert py_start_gate.installed()
        _work()
        assert len(seen) == 3
    finally:
        py_start_gate.release()
    assert not py_start_gate.installed()
    assert all(sys.monitoring.get_tool(tool) is None for tool in py_start_gate.TOOL_IDS)
    _work()
    assert len(seen) == 3


@monitoring_only
def test_a_free_id_is_taken_and_none_free_means_false():
    first = py_start_gate.TOOL_IDS[0]
    sys.monitoring.use_tool_id(first, "someone else")
    try:
        assert py_start_gate.acquire(lambda code, offset: None)
        assert sys.monitoring.get_tool(py_start_gate.TOOL_IDS[1]) == py_start_gate.TOOL_NAME
        py_start_gate.release()
        sys.monitoring.use_tool_id(py_start_gate.TOOL_IDS[1], "someone else too")
        try:
            assert py_start_gate.acquire(lambda code, offset: None) is False
            assert not py_start_gate.installed()
        finally:
            sys.monitoring.free_tool_id(py_start_gate.TOOL_IDS[1])
    finally:
        sys.monitoring.free_tool_id(first)


@monitoring_only
def test_remove_takes_the_callback_away_whatever_the_count():
    """At exit a job thread may never reach its `release`: `remove` frees the tool id anyway, and the late
    `release` finds nothing to undo."""
    seen = []
    assert py_start_gate.acquire(lambda code, offset: seen.append(code) if code is _work.__code__ else None)
    assert py_start_gate.acquire(lambda code, offset: None)
    py_start_gate.remove()
    assert not py_start_gate.installed()
    assert all(sys.monitoring.get_tool(tool) is None for tool in py_start_gate.TOOL_IDS)
    _work()
    assert seen == []
    py_start_gate.release()  # the job thread's own release, later
    assert not py_start_gate.installed()


def test_remove_without_a_callback_does_nothing():
    py_start_gate.remove()
    assert not py_start_gate.installed()


def test_a_forked_child_gets_a_free_lock_and_no_callback(monkeypatch):
    """A job thread of the parent may hold `_lock` at the fork; the child has no such thread (its hook, run here as
    the child would)."""
    held = threading.Lock()
    held.acquire()
    monkeypatch.setattr(py_start_gate, "_lock", held)
    try:
        py_start_gate._after_fork_in_child()
        assert py_start_gate._lock is not held and not py_start_gate.installed()
        assert py_start_gate._lock.acquire(blocking=False)
        py_start_gate._lock.release()
    finally:
        held.release()
