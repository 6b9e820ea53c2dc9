"""aitune_jit/park_spots.py: a job may be held for a fork at a function start outside an import and outside the
standard library's code that holds a lock its before-fork hooks take (`logging`, `concurrent.futures`) or that
other threads wait for (`threading`, `queue`)."""

from __future__ import annotations

import logging
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from aitune_jit import park_spots


def _here() -> object:
    return sys._getframe()


def test_a_plain_function_start_is_parkable_and_an_import_is_not(monkeypatch, tmp_path):
    assert park_spots.parkable(_here()) and not park_spots.importing(_here())
    (tmp_path / "park_spots_probe_module.py").write_text(
        "import sys\nSEEN = (IMPORTING(sys._getframe()), PARKABLE(sys._getframe()))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import builtins

    monkeypatch.setattr(builtins, "IMPORTING", park_spots.importing, raising=False)
    monkeypatch.setattr(builtins, "PARKABLE", park_spots.parkable, raising=False)
    import park_spots_probe_module

    assert park_spots_probe_module.SEEN == (True, False)
    sys.modules.pop("park_spots_probe_module", None)


def test_frames_of_logging_threading_and_futures_or_called_from_them_are_not_parkable():
    seen = {}

    class Spy(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:  # (called by logging's code: the caller is logging's)
            seen["handler"] = park_spots.parkable(sys._getframe())

    logger = logging.getLogger("aitune.test.park_spots")
    logger.addHandler(Spy())
    logger.propagate = False
    logger.warning("x")
    assert seen["handler"] is False
    with ThreadPoolExecutor(1) as pool:  # (the submitted function's caller is concurrent.futures' worker)
        assert pool.submit(lambda: park_spots.parkable(sys._getframe())).result() is False
    condition = threading.Condition()
    with condition:
        frame = sys._getframe()
        assert park_spots.parkable(frame)  # (only threading's own frames count)


def test_the_starting_frame_is_the_first_below_the_gate_s_own_frames():
    def gate_like() -> object:
        return park_spots.starting_frame()

    assert gate_like().f_code is gate_like.__code__
