"""Background tuning: the call that makes a graph ready never waits; the node switches when the worker is done."""

from __future__ import annotations

import os
import threading
import time
import warnings

import pytest
import torch
from jit_helpers import CountingBackend, make_mlp, run, run_exit_hook

from aitune_jit import job_cancel, summary, worker
from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.state import NodeState
from aitune_jit.switch import enable
from aitune_jit.worker import wait_until_tuned


def _timed_calls(model: torch.nn.Module, batches: list[int]) -> list[float]:
    durations = []
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for batch in batches:
            start = time.perf_counter()
            model(torch.randn(batch, 32, generator=generator))
            durations.append(time.perf_counter() - start)
    return durations


def test_the_call_that_completes_min_samples_does_not_wait_for_tuning(background):
    CountingBackend.build_delay_s = 1.0  # a slow build, on the worker
    model = make_mlp()
    enable()
    durations = _timed_calls(model, [2, 3])
    node = PatchedModule.of(model)
    assert max(durations) < 0.5 and node.state is NodeState.RECORDING
    outputs = run(model, [2, 3, 2])  # answered by the original module meanwhile
    torch.testing.assert_close(outputs, run(make_mlp(), [2, 3, 2]))
    assert wait_until_tuned(timeout=30)
    assert node.state is NodeState.TUNED
    infers = CountingBackend.infers
    torch.testing.assert_close(run(model, [2, 3]), run(make_mlp(), [2, 3]))
    assert CountingBackend.infers > infers  # the tuned calls go through the backend now


def test_a_hung_build_is_abandoned_after_the_timeout(background, caplog):
    CountingBackend.build_delay_s = 3.0
    jit_config.tuning_timeout_s = 0.3
    model = make_mlp()
    enable()
    run(model, [2, 3])
    assert wait_until_tuned(timeout=10)
    node = PatchedModule.of(model)
    assert node.state is NodeState.EAGER and "tuning_timeout_s=0.3" in node.reason
    time.sleep(3.2)  # the abandoned build finishes: its result is discarded
    assert node.state is NodeState.EAGER
    torch.testing.assert_close(run(model, [2, 3]), run(make_mlp(), [2, 3]))


def test_a_tuned_module_whose_next_graph_hangs_keeps_its_backend(background):
    """A second graph's build overruns the timeout: the graph it was for runs eagerly, the first stays tuned."""
    model = make_mlp()
    enable()
    run(model, [2, 3])
    assert wait_until_tuned(timeout=30)
    node = PatchedModule.of(model)
    CountingBackend.build_delay_s = 3.0
    jit_config.tuning_timeout_s = 0.3
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # another rank: a new graph
        for _ in range(2):
            model(torch.randn(2, 5, 32, generator=generator))
    assert wait_until_tuned(timeout=10)
    assert node.state is NodeState.TUNED and len(node.backends) == 1
    assert any("tuning_timeout_s=0.3" in why for why in node._failed.values()), node._failed
    torch.testing.assert_close(run(model, [2, 3]), run(make_mlp(), [2, 3]))


def test_wait_until_tuned_times_out_and_pending_names_the_job(background):
    CountingBackend.build_delay_s = 1.0
    model = make_mlp()
    enable()
    run(model, [2, 3])
    assert worker.pending() == ["MLP"]
    assert wait_until_tuned(timeout=0.05) is False
    assert wait_until_tuned(timeout=30) is True and worker.pending() == []
    assert PatchedModule.of(model).state is NodeState.TUNED


def test_stop_at_exit_reports_unfinished_jobs(background):
    CountingBackend.build_delay_s = 1.0
    tuning = worker.TuningWorker(lambda node: time.sleep(1.0))
    model = make_mlp()
    enable()
    run(model, [2])
    tuning.submit(PatchedModule.of(model))
    time.sleep(0.1)
    assert tuning.stop(wait_s=0.05) == ["MLP"]
    worker._unfinished[:] = ["MLP"]
    try:
        assert any("still tuning at exit" in line and "MLP" in line for line in summary.summary_lines())
    finally:
        worker._unfinished.clear()


def test_a_tuned_module_still_tuning_more_shapes_at_exit_is_not_reported_as_eager(background):
    """Its tuned shapes ran tuned; only the calls of the graph still in its job ran eagerly."""
    model = make_mlp()
    enable()
    run(model, [2, 3])
    assert wait_until_tuned(timeout=30) and PatchedModule.of(model).state is NodeState.TUNED
    worker._unfinished[:] = ["MLP"]
    try:
        lines = summary.summary_lines()
        assert any("still tuning more shapes at exit (only those calls ran eagerly): MLP" in line for line in lines)
        assert not any("still tuning at exit (ran eagerly)" in line for line in lines)
        node = PatchedModule.of(model)
        node._follow.package["0"] = ("key", node._entries[0][0])  # all that is left is a package for later runs
        lines = summary.summary_lines()
        assert any("still making a warm-start package at exit" in line and "MLP" in line for line in lines), lines
        assert not any("still tuning" in line for line in lines), lines
    finally:
        worker._unfinished.clear()


def _start_job(body, started) -> tuple:
    """A worker running `body` as the job of an MLP's node, once `started()` is true (at most 30 s: the job may
    first start Inductor's compile process); returns the worker and its job."""
    tuning = worker.TuningWorker(body)
    model = make_mlp()
    enable()
    run(model, [2])
    tuning.submit(PatchedModule.of(model))
    deadline = time.monotonic() + 30
    while not started() and time.monotonic() < deadline:
        time.sleep(0.01)
    return tuning, tuning._current


def test_at_exit_a_running_job_is_cancelled_and_its_thread_ends_before_the_interpreter_finalizes(background):
    """A daemon thread still inside torch's C++ code when the interpreter finalizes aborts the process; `stop`
    raises `TuningCancelled` in the job thread, which leaves its Python loop at once."""
    seen = []

    def compile_forever(node):
        seen.append("running")
        try:
            while True:  # stands for dynamo/Inductor's Python
                sum(range(100))
        except worker.TuningCancelled:
            seen.append("cancelled")
            raise

    tuning, job = _start_job(compile_forever, lambda: seen)
    started = time.monotonic()
    assert tuning.stop(wait_s=5.0) == ["MLP"]
    assert time.monotonic() - started < 2.0 and not job.thread.is_alive()
    assert seen == ["running", "cancelled"] and job.abandoned


def test_a_cancel_that_lands_in_a_weakref_callback_is_quiet_and_still_ends_the_job(background, capfd):
    """The cancel is raised at the job thread's next Python instruction; inside a weakref callback Python cannot
    propagate it ("Exception ignored in ..." and a traceback on stderr). It is dropped quietly there and sent
    again, so the job still ends."""
    import weakref

    class Target:
        pass

    seen = []

    def callback(_ref):
        if "callback" in seen:  # only the first one holds the thread
            return
        seen.append("callback")
        try:
            while True:  # the cancel arrives while this callback runs
                sum(range(100))
        except worker.TuningCancelled:
            seen.append("in callback")
            raise

    def job_body(node):
        seen.append("running")
        try:
            while True:
                target = Target()
                ref = weakref.ref(target, callback)
                del target  # the callback runs here, in the job thread
                assert ref() is None
        except worker.TuningCancelled:
            seen.append("cancelled")
            raise

    tuning, job = _start_job(job_body, lambda: "callback" in seen)
    assert tuning.stop(wait_s=5.0) == ["MLP"]
    assert not job.thread.is_alive()
    assert seen == ["running", "callback", "in callback", "cancelled"]
    assert "Traceback" not in capfd.readouterr().err


def test_at_exit_an_abandoned_job_still_running_is_cancelled_too(background):
    """A timed-out job's thread keeps running after its node went eager; at exit it is cancelled like the current
    one, so no thread is left inside torch when the interpreter finalizes."""
    seen = []
    tuning = worker.TuningWorker(lambda node: seen.append("started") or _spin(seen))
    jit_config.tuning_timeout_s = 0.2
    model = make_mlp()
    enable()
    run(model, [2])
    earlier = set(worker._live_jobs)  # jobs of earlier tests still winding down
    tuning.submit(PatchedModule.of(model))
    assert tuning.wait(timeout=5)  # the supervisor gave up on it; its thread spins on
    [job] = worker._live_jobs - earlier
    assert job.abandoned and job.thread.is_alive()
    run_exit_hook()
    assert job.finished.is_set() and seen == ["started", "cancelled"] and job not in worker._live_jobs
    assert job_cancel.resting(job.thread)  # (it does not end: `_rest_at_exit`)


def _spin(seen: list[str], cancelled: str = "cancelled") -> None:
    """Python that runs until the cancel lands (stands for dynamo/Inductor's), then notes `cancelled`."""
    try:
        while True:
            sum(range(100))
    except worker.TuningCancelled:
        seen.append(cancelled)
        raise


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_without_the_parents_worker(background):
    model = make_mlp()
    enable()
    run(model, [2, 3])
    assert worker._worker is not None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no worker object inherited
        os.write(write, b"none" if worker._worker is None else b"some")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 10)
    os.waitpid(pid, 0)
    assert answer == b"none"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_a_job_runs_exits_without_waiting_for_it(background):
    # the child's exit ran the exit cancel over the parent's live jobs and waited EXIT_WAIT_S for each
    CountingBackend.build_delay_s = 3.0
    jit_config.min_samples = 2
    model = make_mlp()
    enable()
    run(model, [2, 3, 2, 3, 2])
    deadline = time.monotonic() + 10
    while not worker._live_jobs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker._live_jobs
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        start = time.monotonic()
        worker._at_exit()  # what the child's interpreter runs when its code ends
        os.write(write, f"{len(worker._live_jobs)} {time.monotonic() - start:.2f}".encode())
        os._exit(0)
    os.close(write)
    left, took = os.read(read, 64).decode().split()
    os.waitpid(pid, 0)
    assert left == "0" and float(took) < 1.0
    assert wait_until_tuned(timeout=30)


def test_switching_jit_off_while_a_job_runs_leaves_the_module_untouched(background):
    from aitune_jit.switch import disable

    CountingBackend.build_delay_s = 0.5
    model = make_mlp()
    enable()
    run(model, [2, 3])
    disable()
    assert wait_until_tuned(timeout=30)
    assert "forward" not in model.__dict__  # no aitune wrapper came back
    torch.testing.assert_close(run(model, [2, 3]), run(make_mlp(), [2, 3]))
    assert not any(r.path == "MLP" for r in summary._records.values())


def test_calls_during_a_job_are_recorded_so_a_graph_first_seen_then_is_ready_when_it_ends(background):
    """A generate loop's prefill of a new prompt length arrives while the decode graph is being tuned: it is
    recorded then, and one more call of it after the job starts its tuning."""
    CountingBackend.build_delay_s = 0.5
    enable()
    model = torch.nn.Linear(32, 32).eval()
    flat, stacked = torch.randn(4, 32), torch.randn(2, 3, 32)
    with torch.no_grad():
        model(flat)
        model(flat)  # graph 0 ready: queued
        assert worker.pending()
        model(flat)  # graph 0 has its samples: not recorded again while it is tuned
        model(stacked)
        model(stacked)  # graph 1, seen while graph 0 is tuned
        assert wait_until_tuned(timeout=30)
        node = PatchedModule.of(model)
        assert node.state is NodeState.TUNED and node._recorder.num_samples("1") == 2
        assert node._recorder.num_samples("0") == 2
        model(stacked)  # outside graph 0: answered eagerly, and graph 1 is ready: queued at once
        assert wait_until_tuned(timeout=30)
    assert sorted(spec.name for spec, _backend in node._entries) == ["0", "1"]
    with torch.no_grad():
        torch.testing.assert_close(model(stacked), torch.nn.functional.linear(stacked, model.weight, model.bias))


def test_the_exit_cancel_waits_for_a_cuda_graph_capture_to_end(background, monkeypatch):
    """An exception raised into a capture would end it half-way inside torch's CUDA-graph bookkeeping: the cancel
    is held back while the job thread captures and lands once the capture has ended."""
    from aitune_jit import capture_guard

    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", lambda self, *a, **k: None)
    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_end", lambda self: None)
    capture_guard.install()
    seen = []

    def capture_then_compile(node):
        torch.cuda.CUDAGraph.capture_begin(object())
        seen.append("capturing")
        try:
            until = time.monotonic() + 0.6
            while time.monotonic() < until:  # stands for the Python that runs during a capture
                sum(range(100))
        except worker.TuningCancelled:
            seen.append("cancelled inside the capture")
            raise
        torch.cuda.CUDAGraph.capture_end(object())
        seen.append("captured")
        _spin(seen, "cancelled after")

    try:
        tuning, job = _start_job(capture_then_compile, lambda: seen)
        assert tuning.stop(wait_s=5.0) == ["MLP"]
        assert not job.thread.is_alive()
        # raised at the first function start after the capture (inside capture_end's bookkeeping, or later)
        assert seen[0] == "capturing" and "cancelled inside the capture" not in seen
    finally:
        capture_guard.uninstall()


def test_the_exit_cancel_runs_in_threadings_exit_hook_before_the_main_thread_stops(monkeypatch):
    """`threading` runs its exit hooks when the main thread's code ends, before it stops that thread and joins
    the others; a job thread still running Python after that point crashed the process on an H100."""
    hooks = []
    monkeypatch.setattr(worker.threading, "_register_atexit", hooks.append, raising=False)
    registered = []
    monkeypatch.setattr(worker.atexit, "register", registered.append)
    worker._register_exit_cancel()
    assert hooks == [worker._at_exit] and registered == []

    def shutting_down(fn):
        raise RuntimeError("can't register atexit after shutdown")

    monkeypatch.setattr(worker.threading, "_register_atexit", shutting_down)
    worker._register_exit_cancel()
    assert registered == [worker._at_exit]  # (already shutting down: atexit still runs it)


def test_a_tuning_job_waits_for_a_side_jobs_imports_not_for_the_rest_of_it():
    imported, release = threading.Event(), threading.Event()

    def task() -> None:
        imported.set()  # (its imports done)
        release.wait(10)

    thread = worker.start_side_job("test-imports", task, imported)
    begin = time.monotonic()
    worker._side_imports_done(5)
    assert time.monotonic() - begin < 1.0 and thread.is_alive()  # the rest runs beside the job
    release.set()
    thread.join(5)
    assert not worker._side_jobs


def test_a_side_jobs_warnings_stay_out_of_the_programs_record_block():
    # the compiler prefetch imports Inductor beside a warm start; torch's deprecation warnings of those imports
    # went into a serving script's catch_warnings(record=True) blocks (1 to 14 per run)
    opened, warned = threading.Event(), threading.Event()

    def task() -> None:
        opened.wait(5)
        warnings.warn("a side job's deprecation", DeprecationWarning, stacklevel=1)
        warned.set()

    with warnings.catch_warnings(record=True) as program:
        warnings.simplefilter("always")
        thread = worker.start_side_job("test-warns", task)
        opened.set()
        warned.wait(5)
    thread.join(5)
    assert [str(w.message) for w in program] == []


def test_a_job_cancelled_before_its_thread_started_does_not_run(background):
    """The exit cancel may find the supervisor between picking a job and starting its thread: it marks the job
    abandoned, and the job's body then returns at once instead of tuning during the exit."""
    ran = []
    tuning = worker.TuningWorker(lambda node: ran.append(node))
    model = make_mlp()
    enable()
    run(model, [2])
    job = worker._Job(PatchedModule.of(model))
    job.abandoned = True
    tuning._job_body(job)
    assert ran == [] and job.finished.is_set()
    tuning.stop(1.0)



def test_wait_until_tuned_refuses_a_timeout_that_is_not_a_number_and_takes_inf_as_no_limit():
    # "5" and nan returned True at once (no worker yet), and would have failed inside the worker later
    for bad in ("5", float("nan"), True):
        with pytest.raises(TypeError, match="timeout must be a number of seconds or None"):
            worker.wait_until_tuned(bad)
    assert worker.wait_until_tuned(float("inf")) is True
