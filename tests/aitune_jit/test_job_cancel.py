"""aitune_jit/job_cancel.py: a job thread is cancelled at its next Python function start through its step-aside
gate, once, never while it captures a CUDA graph; a thread that starts no Python function gets the asynchronous
cancel after COOPERATIVE_WAIT_S, and the gate's pending cancel is withdrawn then; unraisable cancels are quiet."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from aitune_jit import job_cancel
from aitune_jit import worker_yield as wy
from aitune_jit.job_cancel import TuningCancelled


def _step() -> int:
    return sum(range(50))


class _Thread(threading.Thread):
    """A job thread under `steps_aside`: loops on `work` until cancelled, then runs `cleanup` (Python calls)."""

    def __init__(self, work, paused_by=wy._never) -> None:
        super().__init__(daemon=True)
        self.work, self.paused_by = work, paused_by
        self.seen: list[str] = []
        self.job = SimpleNamespace(abandoned=False, path="job", thread=self, gate=None, cancel_sent=None,
                                   finished=threading.Event())
        self.ready = threading.Event()

    def run(self) -> None:
        with wy.steps_aside(self.paused_by) as gate:
            self.job.gate = gate
            self.ready.set()
            try:
                while True:
                    self.work()
            except TuningCancelled:
                self.seen.append("cancelled")
                for _ in range(3):
                    _step()  # cleanup that calls Python functions runs whole: the cancel is raised once
                self.seen.append("cleaned up")
        self.job.finished.set()


@pytest.fixture
def gated(monkeypatch):
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "25")
    sent = []
    monkeypatch.setattr(job_cancel, "_raise_async", lambda ident: sent.append(ident) or True)
    return sent


def _started(thread: _Thread) -> _Thread:
    thread.start()
    assert thread.ready.wait(5)
    return thread


def test_a_job_that_calls_python_functions_is_cancelled_at_one_of_their_starts(gated):
    thread = _started(_Thread(_step))
    joins = []  # the worker's supervisor joins the job thread: the exit path must neither join nor poll it
    thread.join = thread.is_alive = lambda *args: joins.append(args)
    begin = time.monotonic()
    job_cancel.cancel(thread.job)
    job_cancel.join_cancelled(thread.job, time.monotonic() + 5)
    assert thread.job.finished.is_set() and thread.seen == ["cancelled", "cleaned up"] and joins == []
    del thread.join, thread.is_alive
    thread.join(5)
    assert time.monotonic() - begin < job_cancel.COOPERATIVE_WAIT_S and gated == []  # no asynchronous exception
    assert thread.job.abandoned and wy._cancelling == 0


def test_a_thread_that_starts_no_python_function_gets_the_asynchronous_cancel_and_the_gate_forgets_its_own(gated):
    inside = threading.Event()

    def busy() -> None:  # (entered before the cancel: inside it no Python function starts)
        inside.set()
        while not gated:
            sum(range(50))
        raise TuningCancelled  # what the asynchronous exception would have done

    thread = _started(_Thread(busy))
    assert inside.wait(5)
    job_cancel.cancel(thread.job)
    job_cancel.join_cancelled(thread.job, time.monotonic() + 5)
    assert gated and not thread.is_alive() and thread.seen == ["cancelled", "cleaned up"]
    assert wy._cancelling == 0  # withdrawn before the asynchronous one was sent


def test_no_cancel_is_raised_while_the_thread_captures_a_cuda_graph(gated):
    capturing = threading.Event()
    capturing.set()
    thread = _started(_Thread(_step, paused_by=capturing.is_set))
    job_cancel.cancel(thread.job)
    time.sleep(0.1)
    assert thread.is_alive() and thread.seen == []  # held back during the capture
    capturing.clear()
    job_cancel.join_cancelled(thread.job, time.monotonic() + 5)
    assert not thread.is_alive() and thread.seen == ["cancelled", "cleaned up"]


def test_a_job_without_a_gate_gets_the_asynchronous_cancel_at_once(monkeypatch):
    sent = []
    monkeypatch.setattr(job_cancel, "_raise_async", lambda ident: sent.append(ident) or True)
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    job = SimpleNamespace(abandoned=False, path="job", thread=thread, gate=None, cancel_sent=None,
                          finished=threading.Event())
    job_cancel.cancel(job)
    assert sent == [thread.ident] and job.abandoned
    stop.set()
    thread.join(5)


def test_other_unraisable_exceptions_reach_the_previous_hook(monkeypatch):
    seen = []
    monkeypatch.setattr(job_cancel, "_previous_unraisablehook", seen.append)

    class Unraisable:
        def __init__(self, exc_type):
            self.exc_type, self.object = exc_type, None

    job_cancel._unraisable_cancel(Unraisable(TuningCancelled))  # ours: dropped
    other = Unraisable(ValueError)
    job_cancel._unraisable_cancel(other)
    assert seen == [other]


def test_a_deadline_before_the_cooperative_wait_still_sends_the_asynchronous_cancel(gated):
    """The exit's one deadline may end before COOPERATIVE_WAIT_S: a thread is never left with no cancel at all."""
    inside = threading.Event()

    def busy() -> None:
        inside.set()
        while not gated:
            sum(range(50))
        raise TuningCancelled

    thread = _started(_Thread(busy))
    assert inside.wait(5)
    job_cancel.cancel(thread.job)
    job_cancel.join_cancelled(thread.job, time.monotonic() + 0.05)
    assert gated == [thread.ident]
    thread.join(5)
    assert thread.seen == ["cancelled", "cleaned up"] and wy._cancelling == 0


def test_a_thread_that_rests_stays_alive_and_shrugs_off_a_late_cancel(monkeypatch):
    """`rest_forever`: the thread does not end (nothing it leaves behind can point at its freed stack) and a cancel
    that lands there changes nothing; other threads run meanwhile (it waits without the GIL)."""
    blocker = threading.Lock()
    blocker.acquire()
    attempts = []

    class _Never:
        def acquire(self) -> None:
            attempts.append(1)
            if len(attempts) == 1:
                raise TuningCancelled  # (as a cancel sent just before the job finished would land)
            blocker.acquire()

    monkeypatch.setattr(job_cancel, "_never", _Never())
    thread = threading.Thread(target=job_cancel.rest_forever, daemon=True)
    assert not job_cancel.resting(thread)
    thread.start()
    deadline = time.monotonic() + 5
    while len(attempts) < 2 and time.monotonic() < deadline:
        _step()  # (this thread runs Python meanwhile)
    time.sleep(0.05)
    assert len(attempts) == 2 and thread.is_alive() and job_cancel.resting(thread)


def _interrupted_script(keep: bool) -> int:
    """A script that ends with an uncaught KeyboardInterrupt while a thread runs `exec` of a string (as a job thread
    compiling then does) before the exit cancel ends: its exit status."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import threading
        from aitune_jit.job_cancel import keep_interrupt_exit_status

        def at_exit():
            exec("generated = 1")  # what a job thread may run after the script ended
            if {keep}:
                keep_interrupt_exit_status()

        threading._register_atexit(at_exit)
        raise KeyboardInterrupt
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).returncode


def test_a_script_ended_by_ctrl_c_keeps_its_sigint_exit_status():
    import signal

    assert _interrupted_script(keep=False) == 1  # CPython's flag was cleared by the exec: status 1
    assert _interrupted_script(keep=True) == -signal.SIGINT  # as without aitune: killed by SIGINT (130 in a shell)


def test_a_job_thread_lets_go_of_logging_locks_a_cancel_left_it_holding():
    """An asynchronous cancel landing between a lock's acquire and its `try` leaves the lock held: the program's next
    log call at exit waited for it for good. The job thread releases what it holds before it says it finished."""
    import logging
    import threading

    from aitune_jit.job_cancel import release_logging_locks

    handler = logging.StreamHandler()
    logging.getLogger("aitune.test.locks").addHandler(handler)
    leaked, released = threading.Event(), threading.Event()

    def job() -> None:
        logging._lock.acquire()  # as `isEnabledFor` does on a cache miss, then the cancel lands
        handler.lock.acquire()
        handler.lock.acquire()  # (an RLock taken twice: released as often)
        leaked.set()
        release_logging_locks()
        released.set()
        threading.Event().wait(0.5)  # the thread lives on (as a resting job thread does)

    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    try:
        assert leaked.wait(10) and released.wait(10)
        assert logging._lock.acquire(timeout=2)
        logging._lock.release()
        assert handler.lock.acquire(timeout=2)
        handler.lock.release()
    finally:
        logging.getLogger("aitune.test.locks").removeHandler(handler)
        thread.join(5)


def test_a_job_thread_lets_go_of_module_import_locks_a_cancel_left_it_holding():
    """A job cancelled while it imported a module rested holding that module's import lock; the program's own
    import of it at exit waited for good. The job thread releases such locks before it says it finished."""
    import importlib._bootstrap as bootstrap
    import threading

    from aitune_jit.job_cancel import release_held_locks

    name = "aitune_test_never_imported_module"
    taken, released = threading.Event(), threading.Event()

    def job() -> None:
        lock = bootstrap._get_module_lock(name)
        lock.acquire()  # as `_ModuleLockManager.__enter__` does; the cancel then skipped its `__exit__`
        job.lock = lock  # (keeps the weakly held lock alive)
        taken.set()
        release_held_locks()
        released.set()
        threading.Event().wait(0.5)

    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    try:
        assert taken.wait(10) and released.wait(10)
        lock = job.lock
        assert lock.owner is None
        other = []
        checker = threading.Thread(target=lambda: other.append(lock.acquire() or lock.release() or True))
        checker.start()
        checker.join(5)
        assert other == [True]
    finally:
        thread.join(5)


def test_a_job_thread_lets_go_of_the_global_import_lock_a_cancel_left_it_holding():
    """A cancel right after importlib's `_imp.acquire_lock()` left a resting job thread holding the interpreter's
    global import lock; the program's next import at exit waited for good (sixth round, 3 of 23 runs)."""
    import _imp

    held, released = threading.Event(), threading.Event()

    def job() -> None:
        _imp.acquire_lock()
        _imp.acquire_lock()  # (re-entrant: released as often as taken)
        held.set()
        job_cancel.release_held_locks()
        released.set()

    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    assert held.wait(10) and released.wait(10)
    thread.join(5)
    imported = []
    importer = threading.Thread(target=lambda: imported.append(__import__("colorsys") is not None))
    importer.start()
    importer.join(5)
    assert imported == [True] and not _imp.lock_held()


def test_a_gate_cancel_swallowed_by_a_finalizer_is_dropped_quietly(monkeypatch):
    # a TrainingSwitched raised at a function start inside a generator the collector closed printed "Exception
    # ignored in ... TrainingSwitched" on the program's stderr (a helper's script, sixth round)
    from aitune_jit.training_switch import TrainingSwitched

    seen = []
    monkeypatch.setattr(job_cancel, "_previous_unraisablehook", seen.append)
    job_cancel._unraisable_cancel(SimpleNamespace(exc_type=TrainingSwitched, object=None))
    assert seen == []
