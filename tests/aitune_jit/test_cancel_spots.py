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


def test_no_cancel_lands_while_a_module_is_being_imported(tmp_path, monkeypatch):
    """A job stopped half-way through an import leaves the module's registrations in other modules behind, and every
    later import of it fails (Inductor: "duplicate template name")."""
    import importlib
    import sys

    from aitune_jit import cancel_spots

    seen = []
    (tmp_path / "half_imported.py").write_text(
        "from aitune_jit import cancel_spots\n"
        "def body():\n"
        "    return cancel_spots.may_cancel_in(body.__code__), cancel_spots.importing()\n"
        "RESULT = body()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("half_imported")
    seen.append(module.RESULT)
    sys.modules.pop("half_imported", None)
    assert seen == [(False, True)]
    assert cancel_spots.may_cancel_in(_tick.__code__) and not cancel_spots.importing()  # (a test module's function)
