"""Whether the program leaves a tuning job any gap between its requests: a loop that calls the model back to
back does not, and a job that steps aside for it is starved.

Why: a background job steps aside while a request is in flight (`worker_yield`). A sampling loop (a diffusion
loop, a `generate()` loop) always has one, so its job gets only the slices its waits allow, and each wait that
ends in one of the loop's microsecond gaps wakes the job for nothing and hands the interpreter back and forth.
Measured on this project's 2-core CPU (a tiny diffusers `UNet2DModel` called 20 times a round with an int step,
`benchmarks/probes/stepped_denoiser.py`): with stepping aside the job ran 28 % of the time and was not done after
150 s, while the loop's rounds took 530-750 ms (eager: 280 ms); with no stepping aside (`AITUNE_WORKER_YIELD_MS=0`)
it was tuned after 59-78 s and the rounds took 270-480 ms meanwhile. Stepping aside protects the requests of a
program that has idle time; a program with none is slowed by the job either way, and waiting only makes that
last longer and keeps its speed-up away.

So the job asks `left_no_gap(since, now)`: true when no gap of at least `USABLE_GAP_S` between two requests ended
after `since`, none is open now, and at least `BACK_TO_BACK` requests followed each other since the last one (a
single long request is not a loop: the job's slices during it are `worker_yield`'s streaks). The job takes the
program for saturated when that holds over a window of `SATURATED_AFTER_S` while it steps aside, runs freely for
`FREE_RUN_S`, then steps aside again and looks afresh: a server that the job made fall behind in a free run
catches up while the job steps aside (its requests are served at full speed and come faster than they are due),
and its gaps show again. A gap the job itself causes (it holds the interpreter in C code when a request is due)
counts as a gap: it can only delay a free run. On an H200, a window of 1 s saw a free run start every 7.7 s on
average in a diffusion loop whose steps leave gaps of microseconds (`benchmarks/probes/stepped_denoiser.py`), and
the loop was tuned after 69 s (never within 100 s with stepping aside alone); windows of 2 s that also asked for
the job to have stepped aside half of the time saw none in 127 s, and tumbling windows of 1 s (a new one after
each gap) with free runs of 10 s left the loop untuned after 120 s on a slower H200 (one run each).

The times are kept by `worker_yield`'s request counting (under its lock), and only while a job runs.
"""

from __future__ import annotations

#: a gap between two requests at least this long is time the job can use without slowing a request
USABLE_GAP_S = 0.002
#: the window a job looks at: no usable gap in it, saturated
SATURATED_AFTER_S = 1.0
#: how long a job then runs without stepping aside before it looks again
FREE_RUN_S = 5.0
#: requests that must follow each other without a usable gap before the program is taken for a loop
BACK_TO_BACK = 3

_idle_since: float | None = None  # when the last request ended, while none is in flight (None: one is)
_last_gap_end = 0.0  # when the last usable gap ended
_starts = 0  # requests started since then


def requests_resumed(now: float) -> None:
    """A request starts while none was in flight."""
    global _idle_since, _last_gap_end, _starts
    if _idle_since is not None and now - _idle_since >= USABLE_GAP_S:
        _last_gap_end, _starts = now, 0
    _idle_since = None
    _starts += 1


def requests_ended(now: float) -> None:
    """The last request in flight ended."""
    global _idle_since
    _idle_since = now


def left_no_gap(since: float, now: float) -> bool:
    """True when no usable gap ended after `since`, none is open at `now`, and `BACK_TO_BACK` requests started
    since the last one."""
    if _idle_since is not None and now - _idle_since >= USABLE_GAP_S:
        return False
    return _last_gap_end <= since and _starts >= BACK_TO_BACK


class Window:
    """One job's look at the program (`worker_yield._StepAside`): the last `SATURATED_AFTER_S` of stepping aside."""

    def __init__(self, start: float) -> None:
        self.start = start  # when the job began to step aside, or will again after a free run

    def saturated(self, now: float) -> bool:
        """No usable gap ended in the last `SATURATED_AFTER_S`, all of it spent stepping aside; the next look
        starts after the free run."""
        since = now - SATURATED_AFTER_S
        if self.start > since or not left_no_gap(since, now):
            return False
        self.start = now + FREE_RUN_S
        return True


def watch(now: float, idle: bool) -> None:
    """Start counting afresh (a job starts; `idle`: no request is in flight now): gaps seen before do not count."""
    global _idle_since, _last_gap_end, _starts
    _idle_since, _last_gap_end, _starts = (now if idle else None), 0.0, 0
