"""aitune_jit/worker_yield.py: a background job's thread waits while a request is served, resumes when it ends,
is never starved, and the hook counts one request per outermost module call. The gate is a monitoring callback
on Python 3.12+ and a trace function before (a profile function on request); the tests that need torch import
it themselves, so that the rest runs under a Python without torch (`python3.12 -m pytest --noconftest` on this
file)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from aitune_core.timed_section import timed, timing_now
from aitune_jit import py_start_gate
from aitune_jit import worker_yield as wy

monitoring_only = pytest.mark.skipif(not py_start_gate.available(), reason="needs sys.monitoring (Python 3.12+)")


def _tick() -> None:
    """One Python call: a point where a stepping-aside thread may wait."""


class _Job(threading.Thread):
    """A job thread doing Python calls under `steps_aside()` until stopped; counts them."""

    def __init__(self, paused_by=wy._never) -> None:
        super().__init__(daemon=True)
        self.count = 0
        self.stop = False
        self.gate = None
        self.paused_by = paused_by
        self.started_gate = threading.Event()

    def run(self) -> None:
        with wy.steps_aside(self.paused_by) as gate:
            self.gate = gate
            self.started_gate.set()
            while not self.stop:
                _tick()
                self.count += 1


def _start(thread: _Job) -> _Job:
    thread.start()
    assert thread.started_gate.wait(5)
    return thread


def _finish(thread: _Job) -> None:
    thread.stop = True
    while wy.requests_in_flight():
        wy.request_finished()
    thread.join(5)


@pytest.fixture(params=["default", "trace", "profile"])
def mechanism(request, monkeypatch):
    """Each gate this Python has: its default, the trace and the profile function (AITUNE_WORKER_YIELD_GATE)."""
    if request.param != "default":
        monkeypatch.setenv("AITUNE_WORKER_YIELD_GATE", request.param)
    return request.param



@pytest.fixture
def job(monkeypatch, mechanism):
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "5000")
    thread = _start(_Job())
    yield thread
    _finish(thread)


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


def test_the_gate_is_the_monitoring_callback_where_python_has_it_and_the_trace_function_before(job, mechanism):
    expected = mechanism
    if mechanism == "default":
        expected = "monitoring" if py_start_gate.available() else "trace"
    assert job.gate.mechanism == expected and py_start_gate.installed() == (expected == "monitoring")


@pytest.mark.parametrize("gate_name, get", [("trace", sys.gettrace), ("profile", sys.getprofile)])
def test_the_trace_or_profile_function_is_this_threads_only_and_removed_after(monkeypatch, gate_name, get):
    monkeypatch.delenv("AITUNE_WORKER_YIELD_MS", raising=False)
    monkeypatch.setenv("AITUNE_WORKER_YIELD_GATE", gate_name)
    seen = []
    with wy.steps_aside() as gate:
        assert get() is gate and gate.mechanism == gate_name and gate.max_wait == wy.DEFAULT_MAX_WAIT_S
        other = threading.Thread(target=lambda: seen.append(get()))
        other.start()
        other.join()
    assert get() is None and seen == [None]


@pytest.mark.parametrize("gate_name, checks", [("trace", 2), ("profile", 6)])
def test_the_trace_function_is_called_at_python_calls_only(monkeypatch, gate_name, checks):
    """Why it is cheaper than the profile function: no events at C calls or returns."""
    monkeypatch.setenv("AITUNE_WORKER_YIELD_GATE", gate_name)
    seen = []
    with wy.steps_aside() as gate:
        # (called from the gate: this thread raises no events)
        gate.check = lambda at_call=True, code=None: seen.append(1)
        wy._inflight = 1  # a request in flight, set without a Python call
        try:
            _tick()
            len(seen)  # a C call
            _tick()
        finally:
            wy._inflight = 0
    assert len(seen) == checks  # trace: the two calls; profile: their calls and returns, len's call and return


@pytest.mark.parametrize("gate_name, get, put", [("trace", sys.gettrace, sys.settrace),
                                                 ("profile", sys.getprofile, sys.setprofile)])
def test_off_by_setting_or_when_the_thread_is_already_traced_or_profiled(monkeypatch, gate_name, get, put):
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "0")
    with wy.steps_aside() as gate:
        assert gate is None and get() is None and not py_start_gate.installed()
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "50")
    monkeypatch.setenv("AITUNE_WORKER_YIELD_GATE", gate_name)

    def theirs(frame, event, arg):
        return None

    put(theirs)
    try:
        with wy.steps_aside() as gate:
            assert gate is None and get() is theirs  # (a debugger's or coverage's function is kept)
    finally:
        put(None)


def test_timed_sections_are_not_paused(job):
    """A pause inside a timed call would be measured as the backend's time (`aitune_core.timed_section`)."""
    job.stop = True
    job.join(5)
    ready, go, done = threading.Event(), threading.Event(), threading.Event()
    calls = []

    def timed_job():
        with wy.steps_aside(), timed():
            ready.set()
            go.wait(5)
            calls.append(timing_now())
            for _ in range(1000):
                _tick()
            done.set()

    threading.Thread(target=timed_job, daemon=True).start()
    assert ready.wait(5)
    wy.request_started()
    try:
        go.set()
        assert done.wait(2) and calls == [True]  # a request in flight all along: 1000 calls, no pause
    finally:
        wy.request_finished()


@pytest.mark.parametrize("gate_name, get", [("trace", sys.gettrace), ("profile", sys.getprofile)])
def test_timed_calls_run_without_the_trace_or_profile_function(monkeypatch, gate_name, get):
    """The gate is also taken off while timing: its own cost would be measured."""
    torch = pytest.importorskip("torch")  # noqa: F841
    from aitune_core import profiling

    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "5000")
    monkeypatch.setenv("AITUNE_WORKER_YIELD_GATE", gate_name)
    with wy.steps_aside() as gate:
        with profiling.timing_unpaused():
            assert get() is None
        assert get() is gate
        seen = []
        profiling.measure_all(lambda: seen.append(get()), device="cpu", warmup=0, iterations=3,
                              min_time_s=0.0)  # (untimed warm-up calls keep the gate)
        profiling.compare([lambda: seen.append(get())], device="cpu", warmup=1, budget_s=0.0)
        assert seen and all(hook is None for hook in seen)
        assert get() is gate


def test_the_hook_counts_one_request_per_outermost_call():
    torch = pytest.importorskip("torch")
    from aitune_jit.switch import enable

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


def test_a_job_that_captures_a_cuda_graph_does_not_step_aside(monkeypatch, mechanism):
    """A paused capture would hold up every device synchronization of the requests (capture_guard)."""
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "5000")
    capturing = [True]
    job = _start(_Job(paused_by=lambda: capturing[0]))
    wy.request_started()
    try:
        before = job.count
        time.sleep(0.1)
        assert job.count > before + 100
        capturing[0] = False
        time.sleep(0.05)
        paused_at = job.count
        time.sleep(0.1)
        assert job.count - paused_at <= 2
    finally:
        _finish(job)


@monitoring_only
def test_threads_without_a_gate_run_on_while_a_request_runs(job):
    """The monitoring callback sees every thread's calls; only the job's thread waits."""
    counts = [0]
    stop = threading.Event()

    def serving_side():
        while not stop.is_set():
            _tick()
            counts[0] += 1

    wy.request_started()
    other = threading.Thread(target=serving_side, daemon=True)
    try:
        time.sleep(0.05)
        paused_at = job.count
        other.start()
        time.sleep(0.2)
        assert counts[0] > 1000 and job.count - paused_at <= 2
    finally:
        stop.set()
        other.join(5)
        wy.request_finished()


@monitoring_only
def test_the_callback_is_removed_when_the_last_job_ends(monkeypatch):
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "50")
    with wy.steps_aside() as first:
        with wy.steps_aside() as second:  # (jobs of two devices)
            assert first.mechanism == second.mechanism == "monitoring" and py_start_gate.installed()
        assert py_start_gate.installed()
    assert not py_start_gate.installed() and sys.monitoring.get_tool(py_start_gate.TOOL_IDS[0]) is None



def test_jobs_stepping_aside_is_true_while_a_gate_is_on(job):
    assert wy.jobs_stepping_aside()
    _finish(job)
    assert not wy.jobs_stepping_aside()


def test_the_job_count_comes_back_when_the_job_raises(monkeypatch, mechanism):
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "5000")
    with pytest.raises(RuntimeError, match="compile failed"), wy.steps_aside():
        assert wy.jobs_stepping_aside()
        raise RuntimeError("compile failed")
    assert not wy.jobs_stepping_aside() and wy._gates == {}


def test_a_tuned_nodes_call_is_a_request_while_a_job_steps_aside(monkeypatch):
    """A tuned node is on the hook's fast path (no `observed_call`): while a job runs - re-tuning a new batch
    range of that node, or tuning another module - its calls count themselves, so the job steps aside for them."""
    pytest.importorskip("torch")
    from jit_helpers import CountingBackend, make_mlp, run

    from aitune_jit.config import jit_config
    from aitune_jit.patched_module import PatchedModule
    from aitune_jit.state import NodeState
    from aitune_jit.switch import enable

    jit_config.blocking = True
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0
    enable()
    model = make_mlp()
    run(model, [2, 2])
    node = PatchedModule.of(model)
    assert node is not None and node.state is NodeState.TUNED
    seen = []
    dispatch = PatchedModule._dispatch
    monkeypatch.setattr(PatchedModule, "_dispatch", lambda self, args, kwargs: seen.append(wy.requests_in_flight())
                        or dispatch(self, args, kwargs))
    run(model, [2])
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "5000")
    job = _start(_Job())
    try:
        run(model, [2])
    finally:
        _finish(job)
    run(model, [2])
    assert seen == [0, 1, 0] and wy.requests_in_flight() == 0


class _Stop(BaseException):
    pass


def test_a_cancel_is_raised_once_at_the_next_function_start_under_each_gate(monkeypatch, mechanism):
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "25")
    outcome = []
    ready = threading.Event()

    def run() -> None:
        with wy.steps_aside() as gate:
            outcome.append(gate)
            ready.set()
            try:
                while True:
                    _tick()
            except _Stop:
                for _ in range(3):
                    _tick()  # the unwinding's own calls: raised once only
                outcome.append("stopped")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(5)
    gate = outcome[0]
    assert gate.cancel(_Stop) is True
    thread.join(5)
    assert not thread.is_alive() and outcome[1:] == ["stopped"] and gate.cancel_raised
    assert wy._cancelling == 0 and gate.cancel(_Stop) is False  # (the gate is gone with its job)


@monitoring_only
def test_at_exit_the_monitoring_gates_stand_down_before_any_cancel(monkeypatch):
    """The job then unwinds and ends with no monitoring events on, and its own release changes nothing."""
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "25")
    monkeypatch.delenv("AITUNE_WORKER_YIELD_GATE", raising=False)
    thread = _start(_Job())
    try:
        assert thread.gate.mechanism == "monitoring" and py_start_gate.installed()
        wy.stand_down_monitoring()
        assert not py_start_gate.installed() and not thread.gate.active
        assert thread.gate.cancel(_Stop) is False  # (the caller sends the asynchronous exception instead)
        counted = thread.count
        time.sleep(0.05)
        assert thread.count > counted  # the job runs on, ungated
    finally:
        _finish(thread)
        wy._stood_down = False  # (this process goes on)
    assert not thread.is_alive() and not py_start_gate.installed()
    with wy.steps_aside() as gate:
        assert gate is not None  # (jobs are gated again once the flag is back)


def test_a_job_that_leaves_its_gate_while_requests_are_served_never_waits_for_itself(monkeypatch, mechanism):
    """Leaving the gate resets its state under the module's lock; a gate still installed then would step aside
    inside that lock and wait for itself (it hung jobs within a few thousand exits under every gate)."""
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "25")
    stop = threading.Event()
    jobs = []

    def serve() -> None:
        while not stop.is_set():
            wy.request_started()
            sum(range(50))
            wy.request_finished()

    def job() -> None:
        while len(jobs) < 3000 and not stop.is_set():
            with wy.steps_aside():
                _tick()
            jobs.append(1)

    server, worker = threading.Thread(target=serve, daemon=True), threading.Thread(target=job, daemon=True)
    server.start()
    worker.start()
    worker.join(30)
    stop.set()
    server.join(5)
    assert not worker.is_alive() and len(jobs) == 3000 and not wy._lock.locked()


class _Held:
    """A context manager whose `__exit__` releases what `__enter__` took (as importlib's module lock manager)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __enter__(self) -> _Held:
        self.lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_cancel_is_not_raised_where_a_context_manager_releases_what_it_took(monkeypatch, mechanism):
    # a cancel raised at `__exit__`'s start left importlib's module lock held: the program's import of that
    # module at exit then waited for good; the cancel waits for the next function start that may raise it
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "25")
    held = _Held()
    outcome = []
    inside, go = threading.Event(), threading.Event()

    def run() -> None:
        with wy.steps_aside() as gate:
            outcome.append(gate)
            try:
                with held:
                    inside.set()
                    go.wait(5)  # (C waits: no function start until the block ends, then `__exit__` starts)
                _tick()
            except _Stop:
                outcome.append("stopped")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert inside.wait(5)
    assert outcome[0].cancel(_Stop) is True
    go.set()
    thread.join(5)
    assert outcome[1:] == ["stopped"]  # raised at `_tick`, after the exit released the lock
    assert held.lock.acquire(timeout=1)
    held.lock.release()


def test_the_request_counters_take_the_plain_lock(monkeypatch):
    """A program's signal handler (a per-request deadline) that raised inside the Condition's Python `__enter__`,
    right after its acquire, left the lock held, and every later call of the program waited on it."""

    class Exploding:  # where such a handler's exception landed
        def __enter__(self):
            raise TimeoutError  # (a deadline handler's exception)

        def __exit__(self, *exc_info):
            return False

        def notify_all(self):
            return None

    monkeypatch.setattr(wy, "_cond", Exploding())
    wy.request_started()
    assert wy.requests_in_flight() == 1
    wy.request_finished()
    assert wy.requests_in_flight() == 0 and not wy._lock.locked()
