"""A background tuning job steps aside while a request is being served.

Why: dynamo's trace, AOTAutograd, loading generated code, validation and measurement run on the job thread
(Inductor's code generation goes to its compile process, `worker_compile_process`). They share one GIL with
the serving threads: while both run, the two take turns and an eager request slows down by the job's share.
Measured on this 2-core CPU (a 4-layer BERT served every 10 ms while a 6-layer BERT compiled, Inductor's code
generation in its compile process): p99 40.5 ms and slowest 65 ms while the job ran freely; p99 31.5 ms and
slowest 38.7 ms (eager p99 15.8 ms) while it stepped aside, and the compile took 33 s instead of 21 s. A job
that waits for idle moments finishes later; a request never waits for it, which is the order that matters.

How: the outermost call of a node that is not on the hook's fast path is a request (`request_started` /
`request_finished`, counted over all serving threads), and so is a tuned node's outermost call while a job
runs (`jobs_stepping_aside`): a tuned node is on the fast path, and a job re-tuning its new batch range would
otherwise run through its requests. While a job runs, its thread has a gate that, at each
Python function call while a request is in flight, waits until no request is (the job resumes at once when the
last one ends). A job is never starved: a wait that lasts `max_wait_s()` is followed by `RUN_SLICE_S` of
running regardless, and a job that sees no gap between requests for a second runs freely for a while
(`program_gaps`: a loop that calls the model back to back). A job holding a lock a request needs is released
the same way. Timed calls are not paused (`aitune_core.timed_section`), nor is a job capturing a CUDA graph
(the `paused_by` check that `steps_aside` is given).

Where the gate sits:

- Python 3.12 and later: a `sys.monitoring` callback on function starts (`py_start_gate`): one Python call per
  function start, nothing else changes in how the interpreter runs. A warm ResNet-50 build (H100) took 9.7-10.2 s
  under it, 7.3-9.8 s with no gate.
- Before 3.12, or when no monitoring tool id is free: a trace function of the job thread (`sys.settrace`),
  called at Python calls only (it returns None: no line events), in the interpreter's slow mode for that thread
  (a job 1.33x slower on this CPU, `benchmarks/probes/step_aside_cost.py`).
- `AITUNE_WORKER_YIELD_GATE=profile`: a profile function (`sys.setprofile`), called at C calls too (1.55x).
- A thread that is already traced or profiled (a debugger, coverage) is left alone: that job does not step aside.

The gate is also where a job waits for a fork (`fork_begins`, used by `fork_safety`): at a function start, the
job thread is not inside the C++ code of an operator it called, so it holds no static being initialized there nor
that operator's locks, which `fork()` would copy held into a child whose threads never release them; and
`park_spots.parkable` keeps it from parking inside an import or the standard library's locking code.

`AITUNE_WORKER_YIELD_MS`: the longest wait in milliseconds (default 25; 0 turns stepping aside off).
`AITUNE_WORKER_YIELD_GATE`: `monitoring` (default; the trace function where monitoring is missing), `trace`
or `profile` (e.g. beside a tool that needs every monitoring id).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from aitune_core.timed_section import timing_now
from aitune_jit import cancel_spots, park_spots, program_gaps, py_start_gate
from aitune_jit.worker_env import env_choice, env_number

_logger = logging.getLogger("aitune.jit")

DEFAULT_MAX_WAIT_S = 0.025
#: after a wait that ran out, the job runs this long before it steps aside again
RUN_SLICE_S = 0.01
#: the longest a gate stays parked for a fork (`fork_ended` ends it; this, should that never come)
PARK_LIMIT_S = 30.0

_lock = threading.Lock()
_cond = threading.Condition(_lock)
#: the longest the exit path waits for `_lock` (a thread that died holding it must not hang the exit)
EXIT_LOCK_WAIT_S = 1.0
_stood_down = False  # set at exit (`stand_down_monitoring`): jobs that start later run without a gate
_inflight = 0  # requests being served now, all threads
_waiting = 0  # job threads waiting for the requests to end
_gates: dict[int, _StepAside] = {}  # job thread -> its gate, while it runs under the monitoring callback
_jobs = 0  # job threads inside `steps_aside` (either gate)
_here = threading.local()  # .gate: the current thread's gate while it is installed (`_gated`)
_cancelling = 0  # gates asked to raise in their threads (`_StepAside.cancel`): while any is, every gate call checks
_forking = 0  # forks waiting for the jobs to park (`fork_begins`): while any is, every gate call checks
_park_until = 0.0  # gates park only until then (`fork_begins`)
_parked: set[int] = set()  # job threads parked for a fork
_installed: set[int] = set()  # threads whose gate is on now (either mechanism)
_free_runs = [0]  # free runs begun in this process (`free_runs`)


def request_started() -> None:
    """Count a request in flight (program threads, every outermost call). `with _lock`, not `_cond`: a signal
    handler that raised inside the Condition's Python `__enter__` left it held (SIGALRM deadlines: 5 of 8 hung)."""
    global _inflight
    with _lock:
        if not _inflight and _jobs:
            now = time.monotonic()
            program_gaps.requests_resumed(now)
            if py_start_gate.muted_until and now >= py_start_gate.muted_until:
                py_start_gate.unmute()
        _inflight += 1


def request_finished() -> None:
    global _inflight
    with _lock:  # (see `request_started`; `_cond` is over this lock, so notifying inside is allowed)
        _inflight -= 1
        if _inflight <= 0:
            _inflight = 0
            if _jobs:
                program_gaps.requests_ended(time.monotonic())
            if _waiting:
                _cond.notify_all()


def free_runs() -> int:
    """Free runs begun in this process so far, every job's (`_StepAside._saturated`; a probe reads it)."""
    return _free_runs[0]


def requests_in_flight() -> int:
    return _inflight


def jobs_stepping_aside() -> bool:
    """True while a job's gate is on: calls that skip `observed_call` (a tuned node's, on the hook's fast path)
    count themselves as requests then, so that a re-tuning job steps aside for them too."""
    return _jobs > 0


def max_wait_s() -> float:
    """`AITUNE_WORKER_YIELD_MS` in seconds (0: the job never steps aside)."""
    return max(env_number("AITUNE_WORKER_YIELD_MS", 1e3 * DEFAULT_MAX_WAIT_S), 0.0) / 1e3


def gate_choice() -> str:
    """`AITUNE_WORKER_YIELD_GATE`: monitoring (default), trace or profile."""
    return env_choice("AITUNE_WORKER_YIELD_GATE", ("monitoring", "trace", "profile"), "monitoring")


_clock = time.monotonic  # (one global lookup in the gate's fast path, which runs at every call of the job's thread)


def _never() -> bool:
    return False


class _StepAside:
    """One job's gate: a trace or profile function (`__call__`; a trace function is called at Python calls only,
    and its None asks for no events inside the frame) or the target of the monitoring callback (`check`)."""

    suspend_while_timing = True  # read by aitune_core.profiling

    def __init__(self, max_wait: float, paused_by: Callable[[], bool] = _never) -> None:
        self.max_wait = max_wait
        self.paused_by = paused_by
        self.mechanism = "trace"
        self.free_until = 0.0
        self.waited_s = 0.0
        self.waits = 0
        self.streak_waited_s = 0.0  # waited in the current streak (`_wait`)
        self.last_wait_end = 0.0
        self.slices = 0  # slices run while requests were in flight
        self.window = program_gaps.Window(0.0)  # what `_saturated` looks at
        self.free_runs = 0  # free runs while the program left no gap (`_saturated`)
        self.active = False  # installed (between `_gated`'s start and end)
        self.cancel_with: type[BaseException] | None = None
        self.cancel_raised = False  # a cancel was raised here: the thread is unwinding
        self.ident = 0  # the gated thread
        self.off_s = 0.0  # seconds spent with the gate off (`off`)

    def install(self, ident: int) -> bool:
        """Put the gate on the current thread (`ident`): the monitoring callback where `gate_choice` asks for it and
        a tool id is free, else the trace or profile function. False when the thread is already traced or profiled
        (a debugger, coverage): that job does not step aside."""
        self.ident = ident
        self.window = program_gaps.Window(time.monotonic())
        if gate_choice() == "monitoring" and py_start_gate.acquire(_on_function_start):
            self.mechanism = "monitoring"
            _gates[ident] = self
        else:
            self.mechanism = "profile" if gate_choice() == "profile" else "trace"
            get, put = self._functions()
            if get() is not None:
                return False
            put(self)
        self.active = True
        _installed.add(ident)
        return True

    def uninstall(self) -> None:
        """Take the gate off its thread (called on that thread), then drop a cancel not raised yet. Nothing when it
        is not on (`off` could not put it back: a tool that traces the thread came meanwhile, and keeps its own)."""
        if not self.active:
            return
        if self.mechanism == "monitoring":
            _gates.pop(self.ident, None)  # (the callback finds no gate for this thread from here on)
            try:
                _deactivate(self)
            finally:
                py_start_gate.unmute()  # (a later job's callback must hear every function start)
                py_start_gate.release()
            return
        self._functions()[1](None)
        _deactivate(self)

    @contextlib.contextmanager
    def off(self) -> Iterator[None]:
        """No stepping aside inside the block (called on the gated thread; `running_freely` says when);
        the gate goes back on after it unless the program is ending. A cancel sent meanwhile finds the gate
        inactive, and its sender falls back on its own means."""
        if not self.active:
            yield
            return
        begin = time.monotonic()
        self.uninstall()
        try:
            yield
        finally:
            self.off_s += time.monotonic() - begin
            if not _stood_down:
                self.install(self.ident)

    def _functions(self) -> tuple[Callable[[], Any], Callable[[Any], None]]:
        return (sys.getprofile, sys.setprofile) if self.mechanism == "profile" else (sys.gettrace, sys.settrace)

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if _cancelling or _forking or (_inflight and _clock() >= self.free_until):
            self.check(event == "call", frame.f_code)

    def check(self, at_call: bool = True, code: Any = None) -> None:
        """`at_call`: the thread is starting a Python function (a profile function also sees C calls and
        returns, where a cancel must not be raised: after a C `acquire`, say, it would leak the lock); `code`:
        that function's code, where a cancel is not raised if it releases what was taken (`cancel_spots`)."""
        if not self.active:
            return
        if at_call and self.cancel_with is not None and cancel_spots.may_cancel_in(code) and not self.paused_by():
            self._raise_cancel()
        if _forking and at_call:
            self._park()
        if not _inflight:
            return
        if (self.free_until and time.monotonic() < self.free_until) or timing_now() or self.paused_by():
            return  # (a paused capture would hold up every device synchronization of the requests)
        if self._saturated():
            return
        self._wait()
        if _forking and at_call:  # (the wait ends when a fork begins: park before the function's body runs)
            self._park()
        if at_call and self.cancel_with is not None and cancel_spots.may_cancel_in(code) and not self.paused_by():
            self._raise_cancel()

    def cancel(self, exc_type: type[BaseException]) -> bool:
        """Raise `exc_type` in the gated thread once, at its next Python function start (not while it captures a
        CUDA graph: `paused_by`). False when the gate is not installed. Why not an asynchronous exception
        (`PyThreadState_SetAsyncExc`): that one lands between any two bytecodes, inside the `finally` blocks of
        torch's code and of the thread's own teardown; one raised where a function starts is what that function
        would raise itself, and the cleanup code that runs while it unwinds runs whole."""
        global _cancelling
        held = _lock.acquire(timeout=EXIT_LOCK_WAIT_S)
        try:
            if not self.active:
                return False
            if self.cancel_with is None:
                _cancelling += 1
            self.cancel_with = exc_type
            if held:
                _cond.notify_all()  # (a gate waiting for requests to end raises at once)
        finally:
            if held:
                _lock.release()
        py_start_gate.unmute()  # (a free run's disabled function starts would not hear the cancel)
        return True

    def _raise_cancel(self) -> None:
        exc_type = self.withdraw_cancel(raising=True)
        if exc_type is not None:
            raise exc_type

    def withdraw_cancel(self, raising: bool = False) -> type[BaseException] | None:
        """Drop a cancel not raised yet (returned; None when there was none); `raising`: the gate raises it now.
        Called by the gated thread only inside its gate or once the gate is off: the thread holds `_lock` here,
        and a gate call made meanwhile would wait for it (the same for `cancel` and `_deactivate`)."""
        global _cancelling
        held = _lock.acquire(timeout=EXIT_LOCK_WAIT_S)
        try:
            exc_type, self.cancel_with = self.cancel_with, None
            if exc_type is not None:
                _cancelling -= 1
                self.cancel_raised = self.cancel_raised or raising
        finally:
            if held:
                _lock.release()
        return exc_type

    def _saturated(self) -> bool:
        """The program is saturated (`program_gaps.Window`): the job runs freely for `FREE_RUN_S`."""
        now = time.monotonic()
        if not self.window.saturated(now):
            return False
        self.free_until = now + program_gaps.FREE_RUN_S
        self.free_runs += 1
        _free_runs[0] += 1
        if self.mechanism == "monitoring":
            py_start_gate.mute(self.free_until)
        return True

    def _wait(self) -> None:
        """Wait until no request is in flight, at most `max_wait`, or until the program is found saturated
        (`_saturated`); then run `RUN_SLICE_S` regardless once the waits of one streak add up to `max_wait`. A
        streak is the waits with less than `RUN_SLICE_S` of running between them: a `generate()` loop ends every
        wait idle in a gap of microseconds, and counting each wait alone left the job those gaps only."""
        global _waiting
        begin = time.monotonic()
        if begin - self.last_wait_end >= RUN_SLICE_S:  # (it ran a slice's worth since: a new streak)
            self.streak_waited_s = 0.0
        saturated = False

        def woken() -> bool:  # (looked at again as each request ends: `request_finished` notifies)
            nonlocal saturated
            if _inflight == 0 or self.cancel_with is not None or _forking:
                return True
            saturated = self._saturated()
            return saturated

        with _cond:
            _waiting += 1
            try:
                idle = _cond.wait_for(woken, max(self.max_wait - self.streak_waited_s, 0.0))
            finally:
                _waiting -= 1
        now = time.monotonic()
        self.waits += 1
        self.waited_s += now - begin
        self.streak_waited_s += now - begin
        self.last_wait_end = now
        if saturated:  # (`_saturated` set the free run)
            self.streak_waited_s = 0.0
        elif idle and self.streak_waited_s < self.max_wait:
            self.free_until = 0.0
        else:
            self.free_until, self.streak_waited_s = now + RUN_SLICE_S, 0.0
            self.slices += 1

    def _park(self) -> None:
        """Wait here while a fork is under way (`fork_begins`), unless this spot may hold a lock of the standard
        library's (`park_spots.parkable`) or the forks' `PARK_LIMIT_S` has passed; a cancel ends the wait."""
        if time.monotonic() >= _park_until or not park_spots.parkable(park_spots.starting_frame()):
            return
        with _cond:
            _parked.add(self.ident)
            _cond.notify_all()
            try:
                _cond.wait_for(lambda: not _forking or self.cancel_with is not None,
                               max(0.0, _park_until - time.monotonic()))
            finally:
                _parked.discard(self.ident)


def _on_function_start(code: Any, offset: int) -> Any:
    """The monitoring callback, on every thread: only a job thread, and only while a request runs (or its job is
    being cancelled), goes further. During a free run it asks to hear no more of the function start it is at
    (`py_start_gate.mute`): what the callback costs every thread's calls, and the job's most of all, goes too."""
    if py_start_gate.muted_until and not (_cancelling or _forking):
        if _clock() < py_start_gate.muted_until:
            return py_start_gate.DISABLE
        py_start_gate.unmute()
    if _inflight or _cancelling or _forking:
        gate = _gates.get(threading.get_ident())
        if gate is not None:
            try:
                gate.check(True, code)
            except Exception:  # an error here would surface in whatever code the thread was starting
                _logger.debug("stepping-aside check failed", exc_info=True)


def fork_begins() -> None:
    """A fork is being prepared (`fork_safety`): every gate parks at its next function start where it may
    (`park_spots.parkable`), until `fork_ended` (which must follow) or for `PARK_LIMIT_S` in all."""
    global _forking, _park_until
    with _cond:
        _forking += 1
        _park_until = max(_park_until, time.monotonic() + PARK_LIMIT_S)
        _cond.notify_all()  # (a gate waiting for requests to end parks now)
    py_start_gate.unmute()


def gate_of(ident: int | None) -> str | None:
    """"parked" (for a fork), "on" (a gate is installed on that thread) or None."""
    return "parked" if ident in _parked else "on" if ident in _installed else None


def wait_for_parking(seconds: float) -> None:
    """Wait until a gate parks, or `seconds` pass."""
    with _cond:
        _cond.wait(seconds)


def fork_ended() -> None:
    """In the parent, after a fork `park_for_fork` prepared (or one that failed): the parked gates go on."""
    global _forking, _park_until
    with _cond:
        _forking = max(0, _forking - 1)
        if not _forking:
            _park_until = 0.0  # (the next fork's limit starts with it)
        _cond.notify_all()


@contextlib.contextmanager
def steps_aside(paused_by: Callable[[], bool] = _never) -> Iterator[_StepAside | None]:
    """Run the current (job) thread's Python code only while no request is served (module docstring);
    `paused_by()` True lets it run on regardless (read only while a request is in flight)."""
    wait = max_wait_s()
    if wait <= 0:
        yield None
        return
    gate = _StepAside(wait, paused_by)
    ident = threading.get_ident()
    with _counted_job():
        yield from _gated(gate, ident)


@contextlib.contextmanager
def _counted_job() -> Iterator[None]:
    global _jobs
    with _cond:
        if not _jobs:
            program_gaps.watch(time.monotonic(), idle=not _inflight)
        _jobs += 1
    try:
        yield
    finally:
        with _cond:
            _jobs -= 1


def _gated(gate: _StepAside, ident: int) -> Iterator[_StepAside | None]:
    """The gate installed for the block. On the way out it is taken off before its state is reset
    (`_deactivate` takes `_lock`; a gate still installed would be called inside it and wait for that lock)."""
    if _stood_down or not gate.install(ident):  # (the program is ending, or a tool traces this thread)
        yield None
        return
    _here.gate = gate
    try:
        yield gate
    finally:
        _here.gate = None
        try:
            gate.uninstall()
        finally:
            _log(gate)


def current_gate() -> _StepAside | None:
    """The calling job thread's gate while it is installed (`steps_aside`), else None."""
    return getattr(_here, "gate", None)


def stand_down_monitoring() -> None:
    """At exit, before the jobs are cancelled: the monitoring gates stop now and their callback is removed from
    this thread (`py_start_gate.remove`), so a job thread unwinds from its cancel and ends with no monitoring
    events on, and changes none itself as it ends (its `release` finds nothing to undo). Such a gate no longer
    takes a cancel (`cancel` returns False: the caller falls back on the asynchronous exception). Why: on an H100
    (Python 3.12.3) 3 of 10 cold ResNet-50 serving processes whose jobs were cancelled at exit under the monitoring
    gate crashed (SIGSEGV at the start of `threading.Thread._stop`, right after the job thread ended), and none of
    8 with no gate (`AITUNE_WORKER_YIELD_MS=0`); docs/benchmarks.md, "The crash at exit, continued"."""
    global _stood_down
    _stood_down = True
    gates = list(_gates.values())
    _gates.clear()
    for gate in gates:
        _deactivate(gate)
    py_start_gate.unmute()
    py_start_gate.remove()


def _deactivate(gate: _StepAside) -> None:
    """The gate is leaving: a cancel not raised yet is dropped (the caller falls back on its own means)."""
    gate.active = False
    _installed.discard(gate.ident)
    gate.withdraw_cancel()


def _log(gate: _StepAside) -> None:
    if gate.waits or gate.off_s or gate.free_runs:
        _logger.debug("tuning job stepped aside %d times for requests, %.2fs in all (%s gate; off for %.2fs; "
                      "ran freely %d times while the program left no gap)",
                      gate.waits, gate.waited_s, gate.mechanism, gate.off_s, gate.free_runs)


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's job threads (`fork_safety`): no gate, no job stepping aside, and
    a lock a job thread held at the fork (its gate takes `_lock` at every check) is held by no thread here; left
    as they were, the child's calls kept counting themselves as requests for a job that does not exist, and would
    wait for that lock for good. Requests in flight are the forking thread's own and stay counted."""
    global _lock, _cond, _jobs, _waiting, _cancelling, _forking, _park_until
    _lock = threading.Lock()
    _cond = threading.Condition(_lock)
    _gates.clear()
    _parked.clear()
    _installed.clear()
    _jobs = _waiting = _cancelling = _forking = 0
    _park_until = 0.0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
