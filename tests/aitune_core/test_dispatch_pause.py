"""While the pause is held (by any thread), tuned calls go to the original forward; it nests and always ends."""

from __future__ import annotations

import threading

import pytest

from aitune_core.backends.dispatch_pause import original_forwards_only, paused


def test_the_pause_nests_and_is_released_on_errors():
    assert not paused()
    with original_forwards_only():
        assert paused()
        with original_forwards_only():
            assert paused()
        assert paused()
    assert not paused()
    with pytest.raises(ValueError), original_forwards_only():
        raise ValueError("export failed")
    assert not paused()


def test_a_pause_held_by_another_thread_is_seen_here():
    held, release = threading.Event(), threading.Event()

    def holder():
        with original_forwards_only():
            held.set()
            release.wait(5)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(5)
    assert paused()
    release.set()
    thread.join()
    assert not paused()
