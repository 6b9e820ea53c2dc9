"""aitune_core/timed_section.py: the mark is per thread, nests, and is cleared on the way out (errors too)."""

from __future__ import annotations

import threading

import pytest

from aitune_core.timed_section import timed, timing_now


def test_the_mark_is_this_threads_and_nests():
    seen = []
    assert not timing_now()
    with timed():
        with timed():
            assert timing_now()
        assert timing_now()
        other = threading.Thread(target=lambda: seen.append(timing_now()))
        other.start()
        other.join()
    assert not timing_now() and seen == [False]


def test_an_error_inside_clears_the_mark():
    with pytest.raises(RuntimeError), timed():
        raise RuntimeError("boom")
    assert not timing_now()
