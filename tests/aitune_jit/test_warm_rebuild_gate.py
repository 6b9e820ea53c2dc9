"""aitune_jit/warm_rebuild_gate.py, `running_freely`: a job rebuilding a decision from the cache folder does not step
aside inside the block, gets its gate back after it, and keeps it when `AITUNE_WORKER_YIELD_WARM=on`. Runs under
a Python without torch too, like test_worker_yield.py."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from test_worker_yield import _finish, _Job, _start, _tick, mechanism  # noqa: F401 (mechanism: a fixture)

from aitune_jit import py_start_gate, warm_rebuild_gate
from aitune_jit import worker_yield as wy


class _FreeJob(_Job):
    """A job that enters `running_freely()` on request and says what its gate looked like inside and after."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type = device_type
        self.go_free = threading.Event()
        self.inside = threading.Event()
        self.leave = threading.Event()
        self.seen: dict[str, object] = {}

    def run(self) -> None:
        with wy.steps_aside() as gate:
            self.gate = gate
            self.started_gate.set()
            assert self.go_free.wait(5)
            with warm_rebuild_gate.running_freely(self.device_type):
                self.seen["inside"] = (gate.active, sys.gettrace(), sys.getprofile(), py_start_gate.installed())
                self.inside.set()
                while not self.leave.is_set():
                    _tick()
                    self.count += 1
            self.seen["after"] = (gate.active, sys.gettrace(), sys.getprofile(), py_start_gate.installed())
            while not self.stop:
                _tick()
                self.count += 1


@pytest.mark.usefixtures("mechanism")  # (each gate this Python has)
def test_a_job_running_freely_does_not_step_aside_and_gets_its_gate_back_after(monkeypatch):
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "5000")
    monkeypatch.delenv("AITUNE_WORKER_YIELD_WARM", raising=False)
    thread = _start(_FreeJob())
    try:
        thread.go_free.set()
        assert thread.inside.wait(5)
        assert thread.seen["inside"] == (False, None, None, False)  # no gate of any kind on the thread
        assert not thread.gate.cancel(RuntimeError)  # (its sender falls back on its own means)
        wy.request_started()
        counted = thread.count
        time.sleep(0.1)
        assert thread.count > counted + 100  # it ran on through the request
        thread.leave.set()
        time.sleep(0.1)
        paused_at = thread.count
        time.sleep(0.2)
        assert thread.count - paused_at <= 2  # its gate is back: it waits for the request again
        wy.request_finished()
        deadline = time.monotonic() + 5
        while "after" not in thread.seen and time.monotonic() < deadline:
            time.sleep(0.01)
        active, trace, profile, monitoring = thread.seen["after"]
        assert active and (thread.gate in (trace, profile) or monitoring)
        assert thread.gate.off_s >= 0.1
    finally:
        _finish(thread)


@pytest.mark.parametrize("choice, device_type", [("on", "cpu"), ("auto", "cuda"), (None, "cuda")])
def test_warm_rebuilds_step_aside_on_a_gpu_or_when_asked(monkeypatch, choice, device_type):
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "5000")
    if choice is None:
        monkeypatch.delenv("AITUNE_WORKER_YIELD_WARM", raising=False)
    else:
        monkeypatch.setenv("AITUNE_WORKER_YIELD_WARM", choice)
    thread = _start(_FreeJob(device_type))
    try:
        thread.go_free.set()
        assert thread.inside.wait(5)
        assert thread.seen["inside"][0] is True
        wy.request_started()
        time.sleep(0.05)
        paused_at = thread.count
        time.sleep(0.2)
        assert thread.count - paused_at <= 2
    finally:
        thread.leave.set()
        _finish(thread)


def test_running_freely_outside_a_job_is_a_no_op():
    with warm_rebuild_gate.running_freely("cpu"):
        assert sys.gettrace() is None


def test_a_tracer_that_came_while_the_gate_was_off_is_left_alone(monkeypatch):
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "5000")
    monkeypatch.setenv("AITUNE_WORKER_YIELD_GATE", "trace")
    monkeypatch.delenv("AITUNE_WORKER_YIELD_WARM", raising=False)

    def tool(frame, event, arg):  # a debugger or coverage starting meanwhile
        return None

    with wy.steps_aside() as gate:
        assert sys.gettrace() is gate
        with warm_rebuild_gate.running_freely("cpu"):
            assert sys.gettrace() is None
            sys.settrace(tool)
        assert sys.gettrace() is tool and not gate.active  # (the gate could not go back on)
    try:
        assert sys.gettrace() is tool  # the job's end did not take the tool's function off
    finally:
        sys.settrace(None)
