"""aitune_jit/worker_yield.py: a background job's thread waits while a request is served, resumes when it ends,
is never starved, and the hook counts one request per outermost module call."""

from __future__ import annotations

import sys
import threading
import time

import pytest
import torch

from aitune_core import profiling
from aitune_jit import worker_yield as wy
from aitune_jit.switch import enable


def _tick() -> None:
    """One Python call: a point where a stepping-aside thread may wait."""


class _Job(threading.Thread):
    """A job thread doing Python calls under `steps_aside()` until stopped; counts them."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.count = 0
        self.stop = False
        self.gate = None
        self.started_gate = threading.Event()

    def run(self) -> None:
        with wy.steps_aside() as gate:
            self.gate = gate
            self.started_gate.set()
            while not self.stop:
                _tick()
                self.count += 1


@pytest.fixture
def job(monkeypatch):
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "5000")
    thread = _Job()
    thread.start()
    assert thread.started_gate.wait(5)
    yield thread
    thread.stop = True
    while wy.requests_in_flight():
        wy.request_finished()
    thread.join(5)


def test_the_job_waits_while_a_request_runs_and_resumes_when_it_ends(job):
    assert job.gate is not None
    wy.request_started()
    time.sleep(0.05)  # the job reaches its next call and waits
    paused_at = job.count
    time.sleep(0.2)
    assert job.count - paused_at <= 2
    wy.request_finished()
    time.sleep(0.05)
    assert job.count > paused_at + 100
    assert job.gate.waits >= 1 and job.gate.waited_s > 0.15


def test_a_job_is_not_starved_by_requests_that_never_end(monkeypatch):
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "20")
    thread = _Job()
    wy.request_started()
    try:
        thread.start()
        time.sleep(0.5)
        assert thread.count > 100  # it ran its slices between waits of 20 ms
        assert thread.gate.waits >= 5
    finally:
        wy.request_finished()
        thread.stop = True
        thread.join(5)


def test_the_profile_function_is_this_threads_only_and_removed_after(monkeypatch):
    monkeypatch.delenv("AITUNE_WORKER_YIELD_MS", raising=False)
    seen = []
    with wy.steps_aside() as gate:
        assert sys.getprofile() is gate and gate.max_wait == wy.DEFAULT_MAX_WAIT_S
        other = threading.Thread(target=lambda: seen.append(sys.getprofile()))
        other.start()
        other.join()
    assert sys.getprofile() is None and seen == [None]


def test_off_by_setting_or_when_the_thread_is_already_profiled(monkeypatch):
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "0")
    with wy.steps_aside() as gate:
        assert gate is None and sys.getprofile() is None
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "50")

    def theirs(frame, event, arg):
        return None

    sys.setprofile(theirs)
    try:
        with wy.steps_aside() as gate:
            assert gate is None and sys.getprofile() is theirs
    finally:
        sys.setprofile(None)


def test_timed_calls_run_without_the_pause(monkeypatch):
    """A pause inside a timed call would be measured as the backend's time."""
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "5000")
    with wy.steps_aside() as gate:
        with profiling.timing_unpaused():
            assert sys.getprofile() is None
        assert sys.getprofile() is gate
        seen = []
        profiling.measure_all(lambda: seen.append(sys.getprofile()), device="cpu", warmup=1, iterations=3,
                              min_time_s=0.0)
        profiling.compare([lambda: seen.append(sys.getprofile())], device="cpu", warmup=1, budget_s=0.0)
        assert seen and all(hook is None for hook in seen)
        assert sys.getprofile() is gate


def test_the_hook_counts_one_request_per_outermost_call():
    seen = []

    class Child(torch.nn.Module):
        def forward(self, x):
            seen.append(("child", wy.requests_in_flight()))
            return x + 1

    class Root(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.child = Child()

        def forward(self, x):
            seen.append(("root", wy.requests_in_flight()))
            return self.child(x) * 2

    enable()
    model = Root()
    model(torch.ones(2))
    assert seen == [("root", 1), ("child", 1)]
    assert wy.requests_in_flight() == 0


def test_a_job_that_captures_a_cuda_graph_does_not_step_aside(job, monkeypatch):
    """A paused capture would hold up every device synchronization of the requests (capture_guard)."""
    monkeypatch.setattr(wy, "capturing_here", lambda: True)
    wy.request_started()
    try:
        before = job.count
        time.sleep(0.1)
        assert job.count > before + 100
    finally:
        wy.request_finished()
