"""aitune_core/thread_warnings.py: what a thread inside `private_warnings()` does with `catch_warnings` and filters
stays its own; the program's filters, records and once-per-place warnings are left as they are."""

from __future__ import annotations

import threading
import warnings

import pytest

from aitune_core import thread_warnings
from aitune_core.thread_warnings import private_warnings


@pytest.fixture(autouse=True)
def _uninstalled_after():
    yield
    thread_warnings.uninstall()


def _in_thread(body, *events: threading.Event) -> threading.Thread:
    def run():
        with private_warnings():
            body(*events)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_filter_the_program_adds_while_a_private_catch_is_open_survives_its_end():
    entered, added = threading.Event(), threading.Event()

    def job(entered, added):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Anomaly Detection has been enabled.")
            entered.set()
            added.wait(5)

    with warnings.catch_warnings():
        thread = _in_thread(job, entered, added)
        entered.wait(5)
        warnings.filterwarnings("error", message="strict-1$")
        added.set()
        thread.join(5)
        assert any(f[0] == "error" and f[1] is not None and f[1].pattern == "strict-1$" for f in warnings.filters)
        assert not any(f[1] is not None and f[1].pattern.startswith("Anomaly") for f in warnings.filters)
        with pytest.raises(UserWarning, match="strict-1"):
            warnings.warn("strict-1", UserWarning, stacklevel=1)


def test_the_programs_once_per_place_warning_is_not_shown_again_after_private_catches(recwarn):
    def warn_here():
        warnings.warn("legacy api is deprecated", DeprecationWarning, stacklevel=1)

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        shown = []
        saved, warnings.showwarning = warnings.showwarning, lambda *a, **k: shown.append(a[0])
        try:
            warn_here()

            def job():
                for _ in range(3):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
            _in_thread(job).join(5)
            warn_here()
        finally:
            warnings.showwarning = saved
    assert [str(w) for w in shown] == ["legacy api is deprecated"]


def test_records_stay_on_their_own_thread_and_private_filters_apply_there():
    entered, done = threading.Event(), threading.Event()
    seen: dict[str, list[str]] = {}

    def job(entered, done):
        with warnings.catch_warnings(record=True) as log:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", "dropped")
            entered.set()
            warnings.warn("the job's own", UserWarning, stacklevel=1)
            warnings.warn("dropped here", UserWarning, stacklevel=1)
            done.wait(5)
        seen["job"] = [str(w.message) for w in log]
        with warnings.catch_warnings():
            warnings.filterwarnings("error", "raised")
            with pytest.raises(UserWarning):
                warnings.warn("raised here", UserWarning, stacklevel=1)
            seen["raised"] = ["yes"]

    with warnings.catch_warnings(record=True) as program:
        warnings.simplefilter("always")
        thread = _in_thread(job, entered, done)
        entered.wait(5)
        warnings.warn("the program's own", UserWarning, stacklevel=1)
        done.set()
        thread.join(5)
    assert [str(w.message) for w in program] == ["the program's own"]
    assert seen == {"job": ["the job's own"], "raised": ["yes"]}


def test_outside_a_catch_a_private_threads_filter_is_process_wide_and_uninstall_puts_warnings_back():
    original = warnings.catch_warnings
    with warnings.catch_warnings():
        _in_thread(lambda: warnings.filterwarnings("ignore", "import-time filter")).join(5)
        assert any(f[1] is not None and f[1].pattern == "import-time filter" for f in warnings.filters)
    assert thread_warnings.installed() and warnings.catch_warnings is not original
    thread_warnings.uninstall()
    assert warnings.catch_warnings.__name__ == "catch_warnings" and not thread_warnings.installed()
    assert warnings.catch_warnings is thread_warnings._OriginalCatch


def test_a_private_threads_other_warnings_go_to_its_sink_not_into_the_programs_record_block():
    collected: list[str] = []
    opened, warned = threading.Event(), threading.Event()

    def job():
        with private_warnings(lambda message: collected.append(str(message.message))):
            opened.wait(5)
            warnings.warn("the job's warning", UserWarning, stacklevel=1)
            warned.set()

    thread = threading.Thread(target=job)
    thread.start()
    with warnings.catch_warnings(record=True) as program:
        warnings.simplefilter("always")
        opened.set()
        warned.wait(5)
        warnings.warn("the program's warning", UserWarning, stacklevel=1)
    thread.join(5)
    assert [str(w.message) for w in program] == ["the program's warning"]
    assert collected == ["the job's warning"]
