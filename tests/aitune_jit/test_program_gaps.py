"""aitune_jit/program_gaps.py: a program that calls its model back to back is told from one with idle time
between requests, and a job stepping aside for it runs freely for a while instead of starving. Runs under a
Python without torch too, like test_worker_yield.py."""

from __future__ import annotations

import time

import pytest
from test_worker_yield import _finish, _Job, _start

from aitune_jit import program_gaps as gaps
from aitune_jit import worker_yield as wy


@pytest.fixture(autouse=True)
def _fresh():
    gaps.watch(0.0, idle=True)
    yield
    gaps.watch(0.0, idle=True)


def _requests(start: float, count: int, request_s: float, gap_s: float) -> float:
    """`count` requests on the module's clock from `start`; returns when the last one ended."""
    now = start
    for _ in range(count):
        gaps.requests_resumed(now)
        now += request_s
        gaps.requests_ended(now)
        now += gap_s
    return now - gap_s


def test_requests_with_microsecond_gaps_leave_no_gap():
    end = _requests(10.0, 50, request_s=0.02, gap_s=0.00005)
    gaps.requests_resumed(end + 0.00005)
    assert gaps.left_no_gap(since=end - 0.5, now=end + 0.0001)


def test_a_usable_gap_since_counts_and_an_older_one_does_not():
    end = _requests(10.0, 10, request_s=0.02, gap_s=0.005)  # gaps of 5 ms: usable
    gaps.requests_resumed(end + 0.005)
    assert not gaps.left_no_gap(since=end - 0.1, now=end + 0.01)
    later = _requests(end + 0.005, 60, request_s=0.02, gap_s=0.00005)
    gaps.requests_resumed(later + 0.00005)
    assert gaps.left_no_gap(since=end + 0.1, now=later + 0.001)


def test_a_gap_open_now_is_a_gap():
    end = _requests(10.0, 50, request_s=0.02, gap_s=0.00005)
    assert gaps.left_no_gap(since=end - 0.5, now=end + 0.001)  # 1 ms idle so far: not usable yet
    assert not gaps.left_no_gap(since=end - 0.5, now=end + gaps.USABLE_GAP_S)


def test_one_long_request_is_not_a_loop():
    gaps.requests_resumed(10.0)
    assert not gaps.left_no_gap(since=10.5, now=12.0)  # (its job keeps its slices: `worker_yield` streaks)


def test_watch_forgets_what_was_seen_before():
    _requests(10.0, 50, request_s=0.02, gap_s=0.00005)
    gaps.watch(20.0, idle=True)
    assert not gaps.left_no_gap(since=19.0, now=20.01)  # idle since the job began


def test_a_second_without_gaps_is_saturated_and_the_next_look_starts_after_the_free_run(monkeypatch):
    monkeypatch.setattr(gaps, "SATURATED_AFTER_S", 1.0)
    end = _requests(10.0, 100, request_s=0.02, gap_s=0.00005)
    window = gaps.Window(10.0)
    assert not window.saturated(10.5)  # (half a second of stepping aside so far)
    assert window.saturated(end)
    assert window.start == end + gaps.FREE_RUN_S
    assert not window.saturated(end + 1.0)  # (inside the free run)


def test_a_gap_in_the_last_second_is_not_saturated(monkeypatch):
    monkeypatch.setattr(gaps, "SATURATED_AFTER_S", 1.0)
    end = _requests(10.0, 60, request_s=0.02, gap_s=0.005)
    later = _requests(end + 0.005, 20, request_s=0.02, gap_s=0.00005)  # 0.4 s without gaps after them
    gaps.requests_resumed(later + 0.00005)  # (one in flight from here on)
    window = gaps.Window(10.0)
    assert not window.saturated(later + 0.001)
    assert window.saturated(end + 1.1)  # a second after the last gap ended, with no gap since


def _back_to_back(seconds: float, request_s: float, gap_s: float) -> None:
    """Requests one after another; with `gap_s` 0 no sleep at all between two (test_worker_yield_streaks's loop
    sleeps even then, which hands the interpreter to the job: a gap of up to a switch interval, 5 ms here)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        wy.request_started()
        time.sleep(request_s)
        wy.request_finished()
        if gap_s:
            time.sleep(gap_s)


@pytest.fixture
def short_windows(monkeypatch):
    """A program is taken for saturated after 0.2 s without a gap, and the job then runs freely for 0.3 s."""
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "5000")  # (no slices: what the job runs is its free runs)
    monkeypatch.setattr(gaps, "SATURATED_AFTER_S", 0.2)
    monkeypatch.setattr(gaps, "FREE_RUN_S", 0.3)


def test_a_job_runs_freely_while_the_program_calls_back_to_back(short_windows):
    thread = _start(_Job())
    try:
        before, counted = thread.count, wy.free_runs()
        _back_to_back(0.8, request_s=0.005, gap_s=0)
        assert thread.gate.free_runs >= 1 and wy.free_runs() - counted == thread.gate.free_runs
        assert thread.count > before  # it ran while requests were in flight, with no slice (max wait 5 s)
    finally:
        _finish(thread)


def test_a_job_keeps_stepping_aside_for_a_program_with_idle_time(short_windows):
    thread = _start(_Job())
    try:
        _back_to_back(0.8, request_s=0.01, gap_s=0.01)
        assert thread.gate.free_runs == 0 and thread.gate.waits >= 10
    finally:
        _finish(thread)


def test_a_job_steps_aside_again_when_its_free_run_ends(short_windows):
    thread = _start(_Job())
    try:
        _back_to_back(0.5, request_s=0.005, gap_s=0)
        assert thread.gate.free_runs == 1
        time.sleep(max(thread.gate.free_until - time.monotonic(), 0) + 0.01)  # the free run is over
        wy.request_started()
        time.sleep(0.05)  # the job reaches its next call and waits
        paused_at = thread.count
        time.sleep(0.1)
        assert thread.count == paused_at  # one request, and the look afresh needs 0.2 s: no free run yet
        wy.request_finished()
    finally:
        _finish(thread)


class _Stop(BaseException):
    """What a job's cancel raises (`job_cancel`: not an `Exception`, which the job's own code might catch)."""


def _in_free_run(thread: _Job, deadline_s: float = 5.0) -> None:
    """Serve back to back until the job's gate starts a free run; one request stays in flight after."""
    end = time.monotonic() + deadline_s
    while thread.gate.free_runs == 0 and time.monotonic() < end:
        _back_to_back(0.05, request_s=0.005, gap_s=0)
    assert thread.gate.free_runs == 1
    wy.request_started()


@pytest.fixture
def heard(monkeypatch, short_windows):
    """The monitoring gate's callback, counting the function starts it hears (Python 3.12+)."""
    from aitune_jit import py_start_gate

    if not py_start_gate.available():
        pytest.skip("needs sys.monitoring (Python 3.12+)")
    monkeypatch.setattr(gaps, "FREE_RUN_S", 1.0)
    calls = [0]
    callback = wy._on_function_start

    def counting(code, offset):
        calls[0] += 1
        return callback(code, offset)

    monkeypatch.setattr(wy, "_on_function_start", counting)
    yield calls
    py_start_gate.unmute()


def test_a_monitoring_gate_hears_nothing_more_during_a_free_run(heard):
    """Each function start the callback hears in a free run is disabled: the job's calls cost nothing more."""
    thread = _start(_Job())
    try:
        _in_free_run(thread)
        time.sleep(0.05)
        before, count = heard[0], thread.count
        time.sleep(0.2)
        assert thread.count > count + 1000  # the job runs with a request in flight
        assert heard[0] - before < 20  # and its `_tick` is heard no more
    finally:
        wy.request_finished()
        _finish(thread)


def test_a_request_after_the_free_run_brings_the_gate_back(heard):
    thread = _start(_Job())
    try:
        _in_free_run(thread)
        wy.request_finished()
        time.sleep(max(thread.gate.free_until - time.monotonic(), 0) + 0.01)
        wy.request_started()  # the free run is over: the callback hears function starts again
        time.sleep(0.05)
        paused_at = thread.count
        time.sleep(0.1)
        assert thread.count == paused_at and heard[0] > 0
    finally:
        wy.request_finished()
        _finish(thread)


def test_a_cancel_during_a_free_run_is_raised(heard):
    outcome = []

    class _Cancelled(_Job):
        def run(self) -> None:
            try:
                super().run()
            except _Stop:
                outcome.append("stopped")

    thread = _start(_Cancelled())
    try:
        _in_free_run(thread)
        assert thread.gate.cancel(_Stop)
        thread.join(2)
        assert outcome == ["stopped"]
    finally:
        wy.request_finished()
        _finish(thread)


def test_a_fork_during_a_free_run_parks_the_job(heard):
    thread = _start(_Job())
    try:
        _in_free_run(thread)
        wy.fork_begins()
        try:
            deadline = time.monotonic() + 5
            while wy.gate_of(thread.ident) != "parked" and time.monotonic() < deadline:
                wy.wait_for_parking(0.01)
            assert wy.gate_of(thread.ident) == "parked"
        finally:
            wy.fork_ended()
    finally:
        wy.request_finished()
        _finish(thread)


def test_a_function_start_heard_after_the_free_run_ends_it(heard):
    """With no request to end it, the job's own next function start that the callback still hears (a new one:
    the job compiles code all the time) ends the free run from inside the callback."""
    from aitune_jit import py_start_gate

    class _Fresh(_Job):
        def run(self) -> None:
            with wy.steps_aside() as gate:
                self.gate = gate
                self.started_gate.set()
                while not self.stop:
                    namespace: dict = {}
                    exec(compile("def fresh():\n    pass\n", f"<fresh {self.count}>", "exec"), namespace)
                    namespace["fresh"]()
                    self.count += 1

    thread = _start(_Fresh())
    try:
        _in_free_run(thread)
        wy.request_finished()
        assert py_start_gate.muted_until
        time.sleep(max(thread.gate.free_until - time.monotonic(), 0) + 0.05)
        assert py_start_gate.muted_until == 0.0
    finally:
        _finish(thread)


def test_a_failed_restart_of_the_events_is_not_raised_into_a_request(monkeypatch):
    """The first request after a free run restarts the monitoring events on the program's thread (3.12+)."""
    from aitune_jit import py_start_gate

    if not py_start_gate.available():
        pytest.skip("needs sys.monitoring (Python 3.12+)")

    def failing() -> None:
        raise RuntimeError("monitoring is in a state we did not expect")

    monkeypatch.setattr(py_start_gate.sys.monitoring, "restart_events", failing)
    py_start_gate.mute(1.0)  # (a free run that ended long ago on this clock)
    py_start_gate.unmute()
    assert py_start_gate.muted_until == 0.0
