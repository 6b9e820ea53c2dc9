"""aitune_jit/cancel_spots.py: the functions where a job's cancel must not be raised."""

from __future__ import annotations

import threading

from test_worker_yield import _Held, _tick

from aitune_jit.cancel_spots import may_cancel_in


def test_frozen_importlib_threading_and_logging_are_never_where_a_cancel_lands():
    import importlib._bootstrap as bootstrap
    import logging

    assert not may_cancel_in(bootstrap._ModuleLockManager.__exit__.__code__)
    assert not may_cancel_in(threading.Condition.wait.__code__)
    assert not may_cancel_in(logging.Handler.release.__code__)
    assert not may_cancel_in(_Held.__exit__.__code__)
    assert may_cancel_in(_tick.__code__) and may_cancel_in(None)
