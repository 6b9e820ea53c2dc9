"""aitune_jit/worker_yield.py, streaks of waits: a job whose waits each end with a request's end (a `generate()`
loop, one request per decoding step) still gets its slices; a job with idle time between requests never runs
inside one. Runs under a Python without torch too, like test_worker_yield.py."""

from __future__ import annotations

import time

from test_worker_yield import _finish, _Job, _start

from aitune_jit import worker_yield as wy


def _serve_back_to_back(seconds: float, request_s: float, gap_s: float) -> None:
    """Requests one after another with a short gap between them: the steps of a `generate()` loop."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        wy.request_started()
        time.sleep(request_s)
        wy.request_finished()
        time.sleep(gap_s)


def test_a_job_is_not_starved_by_requests_that_follow_each_other_with_tiny_gaps(monkeypatch):
    """Each wait ends idle in the gap between two requests; the waits of a streak add up, and after `max_wait` of
    them the job runs a slice (before, it had the gaps only)."""
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "20")
    thread = _start(_Job())
    try:
        _serve_back_to_back(0.6, request_s=0.002, gap_s=0.00005)
        assert thread.gate.slices >= 5  # about one per 20 ms of waiting and 10 ms of running
        assert thread.gate.waited_s < 0.6 * 0.85
    finally:
        _finish(thread)


def test_a_job_that_runs_between_requests_never_takes_a_slice_inside_one(monkeypatch):
    """Requests with idle time between them: the job runs in the idle time, each streak is one short wait, and it
    never runs while a request is served."""
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "20")
    thread = _start(_Job())
    try:
        _serve_back_to_back(0.4, request_s=0.008, gap_s=0.02)
        assert thread.gate.waits >= 5 and thread.gate.slices == 0
    finally:
        _finish(thread)
