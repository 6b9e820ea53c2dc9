"""A background tuning job steps aside while a request is being served.

Why: dynamo's trace, AOTAutograd, loading generated code, validation and measurement run on the job thread
(Inductor's code generation goes to its compile process, `worker_compile_process`). They share one GIL with
the serving threads: while both run, the two take turns and an eager request slows down by the job's share.
Measured on this 2-core CPU (a 4-layer BERT served every 10 ms while a 6-layer BERT compiled, Inductor's code
generation in its compile process): p99 40.5 ms and slowest 65 ms while the job ran freely; p99 31.5 ms and
slowest 38.7 ms (eager p99 15.8 ms) while it stepped aside, and the compile took 33 s instead of 21 s. A job
that waits for idle moments finishes later; a request never waits for it, which is the order that matters.

How: the outermost call of a node that is not on the hook's fast path is a request (`request_started` /
`request_finished`, counted over all serving threads). While a job runs, its thread has a profile function
(`sys.setprofile`, this thread only) that, at each Python call or return while a request is in flight, waits
until no request is (the job resumes at once when the last one ends). A job is never starved: a wait that
lasts `max_wait_s()` is followed by `RUN_SLICE_S` of running regardless, so a saturated server still tunes. A
job holding a lock a request needs is released the same way. Timed calls run without the profile function
(`aitune_core.profiling` removes a profile function marked `suspend_while_timing`).

`AITUNE_WORKER_YIELD_MS`: the longest wait in milliseconds (default 25; 0 turns stepping aside off).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from aitune_jit.capture_guard import capturing_here
from aitune_jit.worker_env import env_number

_logger = logging.getLogger("aitune.jit")

DEFAULT_MAX_WAIT_S = 0.025
#: after a wait that ran out, the job runs this long before it steps aside again
RUN_SLICE_S = 0.01

_cond = threading.Condition(threading.Lock())
_inflight = 0  # requests being served now, all threads
_waiting = 0  # job threads waiting for the requests to end


def request_started() -> None:
    global _inflight
    with _cond:
        _inflight += 1


def request_finished() -> None:
    global _inflight
    with _cond:
        _inflight -= 1
        if _inflight <= 0:
            _inflight = 0
            if _waiting:
                _cond.notify_all()


def requests_in_flight() -> int:
    return _inflight


def max_wait_s() -> float:
    """`AITUNE_WORKER_YIELD_MS` in seconds (0: the job never steps aside)."""
    return max(env_number("AITUNE_WORKER_YIELD_MS", 1e3 * DEFAULT_MAX_WAIT_S), 0.0) / 1e3


class _StepAside:
    """The job thread's profile function (one per job)."""

    suspend_while_timing = True  # read by aitune_core.profiling

    def __init__(self, max_wait: float) -> None:
        self.max_wait = max_wait
        self.free_until = 0.0
        self.waited_s = 0.0
        self.waits = 0

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if not _inflight or (self.free_until and time.monotonic() < self.free_until) or capturing_here():
            return  # (a paused capture would hold up every device synchronization of the requests)
        self._wait()

    def _wait(self) -> None:
        global _waiting
        begin = time.monotonic()
        with _cond:
            _waiting += 1
            try:
                idle = _cond.wait_for(lambda: _inflight == 0, self.max_wait)
            finally:
                _waiting -= 1
        now = time.monotonic()
        self.waits += 1
        self.waited_s += now - begin
        self.free_until = 0.0 if idle else now + RUN_SLICE_S


@contextlib.contextmanager
def steps_aside() -> Iterator[_StepAside | None]:
    """Run the current (job) thread's Python code only while no request is served (module docstring)."""
    wait = max_wait_s()
    if wait <= 0 or sys.getprofile() is not None:  # off, or someone profiles this thread: leave it alone
        yield None
        return
    gate = _StepAside(wait)
    sys.setprofile(gate)
    try:
        yield gate
    finally:
        sys.setprofile(None)
        if gate.waits:
            _logger.debug("tuning job stepped aside %d times for requests, %.2fs in all", gate.waits, gate.waited_s)
