"""The background tuning worker: tuning off the request path.

The call that completes `min_samples` for a graph only queues its node (`submit`); the node keeps answering
with the original module while a worker thread tunes it from the recorded samples (each sample owns copies
of its inputs). When tuning ends, the node applies the job's outcome (`TuningOutcome`, `PatchedModule.apply`) in
one step: the dispatcher is complete before the state says TUNED, so each call sees either the old or the new
node, never half of it.

- One worker per process, one job at a time (tuning never competes with itself for the device); of the queued
  nodes, the one with the largest expected gain goes next (`tuning_order.py`; ties in queue order). Each job
  runs on its own daemon thread, supervised: a job still running after
  `jit_config.tuning_timeout_s` is abandoned, its node stays eager (children closed), and the queue goes on;
  whatever the abandoned thread produces later is discarded (`abandoned()`).
- The job (the node's `_tune_queued`) bypasses the hook for its thread (nothing it runs is recorded), runs under
  `torch.no_grad()` and, on CUDA, on a stream of its own, synchronized before the node switches; it hands the
  GIL back quickly and keeps garbage collections small (`worker_courtesy.courteous`), and steps aside while a
  request is being served (`worker_yield`); with `AITUNE_WORKER_COMPILE=subprocess` Inductor's code generation
  runs in a compile process of its own (`worker_compile_process`).
- Exit: the threads are daemons; once the main thread has finished, no job starts and a running one is cut short
  (its outcome is neither applied nor cached, its failures stay off aitune's stderr handler). When the main
  thread's code ends (`threading`'s exit hook, `atexit` where it is missing), the running job is cancelled and
  waited for at most `EXIT_WAIT_S` (`job_cancel` says how, and why a job thread still in Python or in torch's C++
  code at finalization crashed or aborted processes); then the step-aside callback is removed. A job thread that
  ends after that waits for the process to end (`job_cancel.rest_forever`). The exit summary lists what was still
  tuning.
- Fork: while one is under way no job starts, and it waits for the running job's imports (`fork_safety`); a
  forked child (DataLoader worker, gunicorn) starts without a worker, its nodes queued in the parent record again.
- `wait_until_tuned(timeout)` waits for the queue to drain (scripts, tests, benchmarks).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.thread_warnings import private_warnings, to_debug_log
from aitune_jit import (
    capture_guard,
    device_guard_pin,
    fx_trace_lock,
    job_draws,
    job_module_hooks,
    job_rng,
    py_start_gate,
    training_switch,
)
from aitune_jit.config import jit_config
from aitune_jit.inductor_priming import prime_inductor_without_fx_patching
from aitune_jit.job_cancel import (
    TuningCancelled,
    cancel,
    join_cancelled,
    keep_interrupt_exit_status,
    release_held_locks,
    rest_forever,
)
from aitune_jit.node_registry import registry
from aitune_jit.program_gaps import FREE_RUN_S, SATURATED_AFTER_S, USABLE_GAP_S
from aitune_jit.tuning_order import expected_gain, pick_next
from aitune_jit.worker_compile_process import compiles_in_subprocess
from aitune_jit.worker_courtesy import courteous
from aitune_jit.worker_yield import stand_down_monitoring, steps_aside

if TYPE_CHECKING:
    from aitune_jit.outcome import TuningNode

_logger = logging.getLogger("aitune.jit")
#: longest wait for a running job at interpreter exit (seconds)
EXIT_WAIT_S = 5.0


class _Job:
    __slots__ = ("abandoned", "cancel_sent", "finished", "gain", "gate", "node_ref", "path", "started", "thread")

    def __init__(self, node: Any) -> None:
        self.node_ref: Callable[[], Any] = weakref.ref(node)
        self.path = node.path
        self.gain = expected_gain(node)
        self.abandoned = False
        self.started: float | None = None
        self.thread: threading.Thread | None = None
        self.gate: Any = None  # its step-aside gate while it runs (`job_cancel` cancels through it)
        self.cancel_sent: float | None = None
        self.finished = threading.Event()  # its body has returned (`job_cancel` waits on this, never joins)

    @classmethod
    def side(cls, name: str) -> _Job:
        """A job that tunes no node (`start_side_job`): only its thread, for the exit cancel."""
        job = cls.__new__(cls)
        job.node_ref, job.path, job.gain = type(None), name, 0.0  # (node_ref() is None)
        job.abandoned, job.started, job.thread, job.gate, job.cancel_sent = False, None, None, None, None
        job.finished = threading.Event()
        return job


_local = threading.local()


def abandoned() -> bool:
    """True in a job thread whose job was abandoned (timed out) or that outlived the program (the main thread
    finished: torch refuses new thread pools then): its outcome must be neither applied nor remembered."""
    job = getattr(_local, "job", None)
    return job is not None and (job.abandoned or _program_ended())


class TuningWorker:
    """The queue and its supervisor thread (see the module docstring)."""

    def __init__(self, run: Callable[[TuningNode], None]) -> None:
        self._run = run
        self._queue: collections.deque[_Job] = collections.deque()
        self._cond = threading.Condition()
        self._current: _Job | None = None
        self._stopping = False
        self._held = 0  # forks under way (`hold`)
        self._thread = threading.Thread(target=self._loop, name="aitune-tuning", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------------------------------- API
    def submit(self, node: TuningNode) -> None:
        with self._cond:
            if self._stopping:
                node.job_dropped()
                return
            self._queue.append(_Job(node))
            self._cond.notify_all()

    def pending(self) -> list[str]:
        """Paths of the job running now and of the queued ones."""
        with self._cond:
            jobs = ([self._current] if self._current is not None else []) + list(self._queue)
        return [job.path for job in jobs]

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the queue is empty and no job runs; False if `timeout` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._current is not None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def hold(self, held: bool) -> tuple[_Job | None, list[TuningNode]]:
        """Start no new job while a fork is under way (`held`: one begins; else one ended); returns the running job
        and the queued nodes."""
        with self._cond:
            self._held = self._held + 1 if held else max(0, self._held - 1)
            self._cond.notify_all()
            return self._current, [node for node in (job.node_ref() for job in self._queue) if node is not None]

    def stop(self, wait_s: float) -> list[str]:
        """Start no new job, cancel the running one and wait up to `wait_s` for its thread to end; returns what
        is left unfinished."""
        with self._cond:
            self._stopping = True
            for job in self._queue:
                node = job.node_ref()
                if node is not None:
                    node.job_dropped()
            left = [job.path for job in self._queue]
            self._queue.clear()
            self._cond.notify_all()
            current = self._current
        deadline = time.monotonic() + wait_s
        if current is not None:
            cancel(current)
            join_cancelled(current, deadline)
        self.wait(max(0.0, deadline - time.monotonic()))
        return ([current.path] if current is not None else []) + left

    # ---------------------------------------------------------------------------------------- loop
    def _loop(self) -> None:
        while True:
            with self._cond:
                while (not self._queue or self._held) and not self._stopping:
                    self._cond.wait()
                if (self._stopping and not self._queue) or _program_ended():
                    return  # (at exit, `stop` reports and drops what is still queued)
                index = pick_next([queued.gain for queued in self._queue])
                job = self._queue[index]
                del self._queue[index]
                self._current = job
            try:
                self._supervise(job)
            except Exception:  # the supervisor must survive anything a node transition raises
                _logger.debug("supervising the tuning job of %s failed", job.path, exc_info=True)
            finally:
                with self._cond:
                    self._current = None
                    self._cond.notify_all()

    def _supervise(self, job: _Job) -> None:
        node = job.node_ref()
        if node is None:
            return
        del node  # the job thread holds the node only while it runs
        thread = threading.Thread(target=self._job_body, args=(job,), name="aitune-tuning-job", daemon=True)
        job.thread = thread
        job.started = time.monotonic()
        _live_jobs.add(job)
        thread.start()
        if not job.finished.wait(jit_config.tuning_timeout_s):  # (never joined: see `_rest_at_exit`)
            job.abandoned = True
            node = job.node_ref()
            late = f"tuning did not finish within jit_config.tuning_timeout_s={jit_config.tuning_timeout_s:g}s"
            if node is not None:
                node.job_dropped()
                node.give_up(late)

    def _job_body(self, job: _Job) -> None:
        _local.job = job
        try:
            node = job.node_ref()
            if node is None or job.abandoned:  # (cancelled before its thread started: the exit found no thread)
                return
            _side_imports_done(SIDE_JOB_WAIT_S)  # (they import what this job needs: one import, not two at once)
            prime_inductor_without_fx_patching()
            for own in (job_draws, job_module_hooks):  # the compiler's draws, and its module hooks, stay the job's
                own.install()
            if torch.cuda.is_available():
                capture_guard.install()  # the job and the application capture and synchronize concurrently
            gate = steps_aside(_keeps_running)  # (waits from the start)
            with (job_rng.on_job_thread(), gate as job.gate, training_switch.watching(node.module, job),
                  _own_stream(node), courteous(), compiles_in_subprocess()):
                self._run(node)  # the runner bypasses the hook and turns gradients off for this thread
            _say_free_runs(node, job.gate)
        except Exception:  # the runner reports its own failures; this is the last line of defence
            _logger.debug("tuning job of %s failed", job.path, exc_info=True)
        except training_switch.TrainingSwitched:
            pass  # (said in the history; the node records again)
        except TuningCancelled:
            _logger.debug("tuning job of %s cancelled at exit", job.path)
        finally:
            release_held_locks()  # (before saying it finished: see job_cancel)
            _local.job = None
            _live_jobs.discard(job)
            job.finished.set()
            _rest_at_exit()


def _say_free_runs(node: TuningNode, gate: Any) -> None:
    """One history line when the job stopped stepping aside because the program left it no gap (`program_gaps`)."""
    if gate is not None and gate.free_runs:
        registry.log(f"{node.short}: its calls came back to back (no gap of {USABLE_GAP_S * 1e3:g} ms for "
                     f"{SATURATED_AFTER_S:g} s), so its job ran without stepping aside {gate.free_runs} time(s), "
                     f"{FREE_RUN_S:g} s each")


def _keeps_running() -> bool:
    """The job does not step aside while it captures a CUDA graph or traces with a program thread waiting."""
    return capture_guard.capturing_here() or fx_trace_lock.others_waiting_here()


@contextlib.contextmanager
def _own_stream(node: TuningNode) -> Iterator[None]:
    """On CUDA, compile and capture on a side stream, so the main thread's kernels are not queued behind them;
    synchronized before the job ends (and before the node switches, see `sync_stream`)."""
    module = node.module
    device = jit_config.device
    if device is None and module is not None:
        device = next((p.device for p in module.parameters()), None)
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        yield
        return
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.default_stream(device))  # the samples' copies, queued by the calling thread
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        stream.synchronize()


def sync_stream() -> None:
    """Before a node switches to a backend built on this thread: its work on the side stream is complete."""
    if getattr(_local, "job", None) is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.current_stream().synchronize()


# -------------------------------------------------------------------------------------------- process-wide
_worker: TuningWorker | None = None
_worker_lock = threading.Lock()
_atexit_registered = False


def _program_ended() -> bool:
    """True once the main thread's code has ended (the exit cancel has begun) or the main thread is gone."""
    return _exiting or not threading.main_thread().is_alive()


def _rest_at_exit() -> None:
    """Once the program's end has begun, a job thread (cancelled or done) does not end: it waits for the process to
    end (`job_cancel.rest_forever` says why)."""
    try:
        ending = _program_ended()
    except BaseException:  # (a late cancel landing here: the program is ending)
        ending = True
    if ending:
        rest_forever()


def _quiet_after_exit(record: logging.LogRecord) -> bool:
    """A job cut short by the program's end fails in odd ways (torch refuses new thread pools): those records are
    not shown on aitune's own stderr handler; the exit summary says what was still tuning instead."""
    if record.threadName.startswith("aitune-tuning") and _program_ended():
        job = getattr(_local, "job", None)
        if job is not None and job.path not in _unfinished:
            _unfinished.append(job.path)
        return False
    return True


def _quiet_stderr_handler() -> None:
    from aitune_core.log import ROOT_LOGGER_NAME, StderrWarningHandler

    for handler in logging.getLogger(ROOT_LOGGER_NAME).handlers:
        if isinstance(handler, StderrWarningHandler) and _quiet_after_exit not in handler.filters:
            handler.addFilter(_quiet_after_exit)


def submit(node: TuningNode, run: Callable[[TuningNode], None]) -> None:
    """Queue `node` for tuning by `run(node)` on the worker (started on first use)."""
    global _worker, _atexit_registered
    device_guard_pin.pin()  # (before the first job thread traces: see device_guard_pin)
    job_rng.install()  # (a job's compiles leave the program's random streams alone: see job_rng)
    fx_trace_lock.install()  # (the program's FX traces and the job's take turns: see fx_trace_lock)
    with _worker_lock:
        if _worker is None:
            _worker = TuningWorker(run)
            _quiet_stderr_handler()
            if not _atexit_registered:
                _atexit_registered = True
                _register_exit_cancel()
        worker = _worker
    worker.submit(node)


def hold_for_fork(held: bool) -> tuple[_Job | None, list[TuningNode]]:
    """`TuningWorker.hold` on this process's worker (`fork_safety`)."""
    return _worker.hold(held) if _worker is not None else (None, [])


def live_job_threads() -> list[tuple[threading.Thread, threading.Event]]:
    """The threads of the jobs running now (tuning jobs, abandoned ones included, and side jobs), each with the
    event set when its job is finished (`fork_safety`)."""
    return [(job.thread, job.finished) for job in list(_live_jobs) if job.thread is not None]  # (one C-level copy)


def pending() -> list[str]:
    worker = _worker
    return worker.pending() if worker is not None else []


def wait_until_tuned(timeout: float | None = None) -> bool:
    """Wait until background tuning has nothing left to do (queue empty, no job running): True when it drained,
    False when `timeout` seconds (None or inf: no limit) passed first. Modules that become ready later (new graphs,
    children of a module that stayed eager) queue new jobs; call it again after those calls."""
    if timeout is not None and (type(timeout) is bool or not isinstance(timeout, int | float) or timeout != timeout):
        raise TypeError(f"wait_until_tuned: timeout must be a number of seconds or None, got {timeout!r}")
    timeout = None if timeout == float("inf") else timeout
    worker = _worker
    if worker is None:
        return True
    drained = worker.wait(timeout)
    return drained and worker.wait(0)


_unfinished: list[str] = []


def unfinished_at_exit() -> list[str]:
    """What was still tuning (or queued) when the interpreter exited (for the exit summary)."""
    return list(_unfinished)


#: job threads still running, abandoned ones (timed out) included: every one is cancelled at exit
_live_jobs: set[_Job] = set()


def start_side_job(name: str, task: Callable[[], None], imported: threading.Event | None = None) -> threading.Thread:
    """Run `task` on a daemon thread that steps aside for requests and is cancelled at exit like a tuning job
    (`compiler_prefetch`); failures are logged at DEBUG. A tuning job that starts meanwhile waits for `imported`
    (set by the task once it has imported what it needs; else when it ends) before it imports torch's compiler."""
    global _atexit_registered
    job = _Job.side(name)
    settled = imported if imported is not None else job.finished
    job_rng.install()
    fx_trace_lock.install()

    def body() -> None:
        _local.job = job
        try:
            with job_rng.on_job_thread(), steps_aside() as job.gate, private_warnings(to_debug_log):
                task()
        except Exception:
            _logger.debug("%s failed", name, exc_info=True)
        except TuningCancelled:
            pass  # (the program ended first)
        finally:
            release_held_locks()
            _local.job = None
            _live_jobs.discard(job)
            _side_jobs.pop(job, None)
            settled.set()
            job.finished.set()
            _rest_at_exit()

    job.thread = threading.Thread(target=body, name=f"aitune-{name}", daemon=True)
    with _worker_lock:
        _live_jobs.add(job)
        _side_jobs[job] = settled
        if not _atexit_registered:
            _atexit_registered = True
            _register_exit_cancel()
    try:
        job.thread.start()
    except BaseException:  # (no thread: nothing for the exit to wait for)
        _live_jobs.discard(job)
        _side_jobs.pop(job, None)
        settled.set()
        job.finished.set()
        raise
    return job.thread


_side_jobs: dict[_Job, threading.Event] = {}  # running side jobs (`start_side_job`) -> their imports are done
#: the longest a tuning job waits for the side jobs running when it starts (seconds)
SIDE_JOB_WAIT_S = 60.0


def _side_imports_done(timeout: float) -> None:
    """Wait (at most `timeout`) until the side jobs running now have imported what they import: the compiler
    prefetch imports Inductor, which the job imports too, and two threads importing torch's mutually importing
    modules at once is what Python's import locks handle worst. The rest of a side job runs beside the job."""
    deadline = time.monotonic() + timeout
    for job, imported in list(_side_jobs.items()):
        if job.thread is not threading.current_thread():
            imported.wait(max(0.0, deadline - time.monotonic()))


def _register_exit_cancel() -> None:
    """Cancel the running job when the main thread's code ends, before the interpreter stops that thread and
    joins the others (module docstring, "Exit"): `threading`'s own exit hook, the one `concurrent.futures` uses;
    `atexit` on a Python without it or once the interpreter is already shutting down."""
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(_at_exit)
            return
        except RuntimeError:  # ("can't register atexit after shutdown")
            pass
    atexit.register(_at_exit)


#: set when the exit cancel begins: from then on the job's records are not shown (`_quiet_after_exit`)
_exiting = False


def _at_exit() -> None:
    global _exiting
    _exiting = True
    stand_down_monitoring()  # (before any cancel: see its docstring)
    deadline = time.monotonic() + EXIT_WAIT_S
    for job in list(_live_jobs):  # abandoned (timed-out) and side jobs first: their threads may still be in torch
        if job.abandoned or job.node_ref() is None:
            cancel(job)
    worker = _worker
    if worker is not None:
        for path in worker.stop(max(0.0, deadline - time.monotonic())):  # (one deadline for all the jobs)
            if path not in _unfinished:
                _unfinished.append(path)
    for job in list(_live_jobs):
        join_cancelled(job, deadline)
    py_start_gate.remove()  # (a thread still in torch's C++ code keeps no callback on every function start)
    keep_interrupt_exit_status()


def _after_fork_in_child() -> None:
    """The parent's threads do not exist in the child: no worker, and no job for its exit to wait for (a DataLoader
    worker waited `EXIT_WAIT_S` at its exit for the parent's running job)."""
    global _worker
    _worker = None
    _live_jobs.clear()
    _side_jobs.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
