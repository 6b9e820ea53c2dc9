"""How a tuning job shares the interpreter with the threads that serve requests.

A tuning job is hours of CPython bytecode squeezed into seconds (dynamo's tracing, AOT autograd, Inductor's
lowering), and it shares one GIL with the application. Measured on an H100 (ResNet-50 served every 20 ms while
the worker tuned it, `benchmarks/probes/background_tuning.py`): requests that take 7 ms alone took up to 2.8 s,
and the sampled stacks put the main thread inside ordinary eager ops (a convolution, a batch norm). Two causes:

- **The GIL convoy.** Every CUDA op releases the GIL while it launches; the tuning thread takes it at once, and
  the serving thread waits a whole switch interval (5 ms by default) to get it back - per op, hundreds of ops
  per request. During a job the switch interval is lowered to `switch_interval_s()`, so a thread that wants the
  GIL gets it within microseconds; when the application is idle nobody asks for the GIL and nothing changes.
  The previous interval comes back when the job ends.
- **Full garbage collections** of a heap that the compile has doubled: 300-550 ms each, several per job, every
  one a stop for every thread. During a job, `gc.freeze()` moves everything that existed before it out of the
  collector's sight, so the job's collections scan only what the job allocated; everything frozen comes back
  (`gc.unfreeze()`) when the last job ends. The job allocates a lot that lives on (the compiler's modules and
  caches), so on an H200 its full collections still took 70-135 ms each. `AITUNE_WORKER_GC=refreeze` also
  freezes what survives each full collection during a job (`gc.callbacks`), so the next one scans only what is
  newer: 20-35 ms each in the same runs. It is not the default: cyclic garbage that was alive at such a moment
  is not collected until the job ends, and in two of its ResNet-50 runs on an H200 (1a2e856, 36dbb8c) the
  `reduce-overhead` candidate failed torch's check that every tensor left in the CUDA-graph pool is an output
  (the check collects garbage first, and frozen garbage is out of its reach; the same error was seen once
  without it, on an H100). `AITUNE_WORKER_GC=young` freezes as the default does and also keeps the collector to
  its young generations while the job runs (no automatic full collection: each one stopped every thread for
  75-190 ms on an H200), then collects the job's own objects once, fully, before the thaw: one such stop per job
  instead of several. With `AITUNE_WORKER_GC=pause` automatic collection is off during the job instead and one
  collection of the youngest generation follows it (unless the program's own last word during the job was
  `gc.disable()`: it stays off); `keep` leaves the collector alone.
  `gc.freeze()` is also a program's own tool (a server that preloads and forks freezes its heap so the children
  share its pages): a program that has frozen objects when a job starts keeps its arrangement (the job freezes
  nothing and pauses automatic collection instead, as `pause` does), and one that freezes more while a job runs
  keeps everything frozen (the job's unfreeze would thaw the program's objects too). "Frozen by the program"
  means beyond what was frozen when aitune was imported: Python 3.12 starts with a few hundred objects frozen
  (375 on 3.12.1 and 3.12.3, even with `-S -I`), and counting those made every job skip its freeze.

`AITUNE_WORKER_SWITCH_US` sets the interval in microseconds (0: leave the interpreter's own).

A process forked while a job runs (a DataLoader worker, a preforking server) has no job thread, so nothing there
would ever restore the interval or thaw the heap: the child puts both back at once (`os.register_at_fork`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator

from aitune_core.patch import Patch
from aitune_jit.worker_env import env_choice, env_number

_logger = logging.getLogger("aitune.jit")

#: the switch interval while a job runs (seconds): a thread that asks for the GIL waits about this long
DEFAULT_SWITCH_INTERVAL_S = 10e-6
GC_POLICIES = ("freeze", "refreeze", "young", "pause", "keep")
#: the oldest generation's threshold while a `young` job runs: no automatic full collection
NO_FULL_COLLECTIONS = 2**30
#: the generation whose collections scan everything not frozen
OLDEST = 2

_lock = threading.Lock()
_active = 0  # jobs inside `courteous()` (one at a time in practice; counted to restore exactly once)
_saved_interval: float | None = None
_set_interval: float | None = None  # the interval the first job set (the program's own, if it differs at the end)
_frozen_by_job: int | None = None  # objects frozen when the first job froze the heap (None: the job froze nothing)
_young_thresholds: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # (the program's, the job's) under `young`
#: objects frozen before aitune was imported (the interpreter's own on Python 3.12): not the program's freeze
FROZEN_AT_IMPORT = gc.get_freeze_count()


def switch_interval_s() -> float | None:
    """The interval during a job, from `AITUNE_WORKER_SWITCH_US` (None: leave the interpreter's own)."""
    value = env_number("AITUNE_WORKER_SWITCH_US", 1e6 * DEFAULT_SWITCH_INTERVAL_S)
    return value * 1e-6 if value > 0 else None


def gc_policy() -> str:
    """`AITUNE_WORKER_GC`: freeze (default), refreeze, young, pause or keep (see the module docstring)."""
    return env_choice("AITUNE_WORKER_GC", GC_POLICIES, "freeze")


@contextlib.contextmanager
def courteous() -> Iterator[None]:
    """Run a tuning job with the GIL handed back quickly and full collections kept small (module docstring)."""
    policy = _enter(gc_policy())
    paused = policy == "pause" and gc.isenabled()
    watch: list[Patch] = []
    if paused:
        gc.disable()
        watch = _watch_program_gc()
    try:
        yield
    finally:
        if paused:
            for patch in reversed(watch):
                patch.restore()
            if _program_gc != [False]:  # (a program that switched collection off meanwhile keeps it off)
                gc.enable()
                gc.collect(0)
        _leave()


#: the program's last `gc.enable()` (True) or `gc.disable()` (False) while a job paused collection
_program_gc: list[bool] = []


def _watch_program_gc() -> list[Patch]:
    """Note the program's own `gc.enable()` / `gc.disable()` while a job has paused collection: a preforking server
    that switched collection off during a job found it on again after it (ninth review, 2026-11-26)."""
    _program_gc.clear()

    def noting(original: Callable[[], None], enabled: bool) -> Callable[[], None]:
        def call() -> None:
            _program_gc[:] = [enabled]
            original()
        return call

    return [Patch(gc, "disable", noting(gc.disable, False)).apply(),
            Patch(gc, "enable", noting(gc.enable, True)).apply()]


def _enter(policy: str) -> str:
    """Count the job in; the first one sets the interval and freezes. Returns the policy this job runs under: a
    freeze policy becomes "pause" when the program has frozen objects of its own (module docstring)."""
    global _active, _saved_interval, _frozen_by_job, _set_interval
    interval = switch_interval_s()
    with _lock:
        _active += 1
        freezes = policy in ("freeze", "refreeze", "young")
        if freezes and _frozen_by_job is None and gc.get_freeze_count() > FROZEN_AT_IMPORT:
            policy = "pause"  # (the program's own freeze: this job neither freezes nor thaws)
        if _active != 1:
            return policy
        if interval is not None:
            _saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(interval)
            _set_interval = sys.getswitchinterval()  # (as the interpreter rounded it)
        if policy in ("freeze", "refreeze", "young"):
            gc.freeze()
            _frozen_by_job = gc.get_freeze_count()
            if policy == "refreeze":
                gc.callbacks.append(_freeze_survivors)
            if policy == "young":
                _keep_to_young_generations()
        return policy


def _keep_to_young_generations() -> None:
    """No automatic full collection until the job ends (`young`); the program's thresholds are kept to restore."""
    global _young_thresholds
    program = gc.get_threshold()
    gc.set_threshold(*program[:OLDEST], NO_FULL_COLLECTIONS)
    _young_thresholds = (program, gc.get_threshold())


def _collect_the_jobs_objects() -> None:
    """`young`: the program's thresholds back (unless it set its own meanwhile), then one full collection while
    the old heap is still frozen, so it reads only what the job left."""
    global _young_thresholds
    if _young_thresholds is None:
        return
    program, set_by_job = _young_thresholds
    _young_thresholds = None
    if gc.get_threshold() == set_by_job:
        gc.set_threshold(*program)
    if gc.isenabled():
        gc.collect(OLDEST)


def _leave() -> None:
    global _active, _saved_interval, _frozen_by_job
    with _lock:
        _active -= 1
        if _active != 0:
            return
        if _saved_interval is not None:
            if sys.getswitchinterval() == _set_interval:  # (an interval the program set meanwhile is its own)
                sys.setswitchinterval(_saved_interval)
            _saved_interval = None
        if _freeze_survivors in gc.callbacks:
            gc.callbacks.remove(_freeze_survivors)
        _collect_the_jobs_objects()
        if _frozen_by_job is not None:
            if gc.get_freeze_count() <= _frozen_by_job:  # (frozen objects that died since only lower the count)
                gc.unfreeze()
            else:
                _logger.debug("the program froze objects while a tuning job ran; leaving the heap frozen")
            _frozen_by_job = None


def _freeze_survivors(phase: str, info: dict[str, int]) -> None:
    """A `gc.callbacks` entry while a job runs: after a full collection, freeze what survived it (module
    docstring). It runs on whichever thread collected, possibly one inside `_enter` or `_leave`, so it takes no
    lock; one assignment keeps the count that `_leave` compares with."""
    global _frozen_by_job
    if phase == "stop" and info.get("generation") == OLDEST and _frozen_by_job is not None:
        gc.freeze()
        _frozen_by_job = gc.get_freeze_count()


def _after_fork_in_child() -> None:
    """The child of a fork made while a job ran: the job's changes come off (module docstring)."""
    global _lock, _active, _saved_interval, _frozen_by_job, _young_thresholds
    _lock = threading.Lock()  # (the parent's job thread may have held it at the fork)
    if _active and _saved_interval is not None:
        sys.setswitchinterval(_saved_interval)
    if _freeze_survivors in gc.callbacks:
        gc.callbacks.remove(_freeze_survivors)
    if _young_thresholds is not None:
        gc.set_threshold(*_young_thresholds[0])
    if _frozen_by_job is not None:
        gc.unfreeze()
    _active, _saved_interval, _frozen_by_job, _young_thresholds = 0, None, None, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
