"""A fork while a tuning job runs: the child must not inherit the locks the job thread holds.

Why: a job holds locks while it compiles - the import lock of each module it imports (torch imports its compiler
lazily), dynamo's compile lock, the root's tuning lock - and `fork()` copies them held into a child whose threads
never release them. A child forked while the worker compiled (a DataLoader worker, a gunicorn worker forked after
warm-up requests, `multiprocessing` with the fork start method) hung for good on its first import of such a module
or its first compile: on this project's CPU a child's own `torch.compile` waited more than 90 s, on a module lock
and, forked later in the job, on dynamo's compile lock.

The parent's job is never interrupted (an exception raised in it while it imports half of Inductor's `lowering`
left that module registered twice, and every later compile of the process failed, the program's own included). So:

- before a fork (`os.register_at_fork`): the worker starts no new job (`worker.hold_for_fork`), and the fork waits
  until every running job (side jobs too) is parked by its step-aside gate at a Python function start where it
  holds no import or standard-library lock (`worker_yield.fork_begins`, `park_spots.parkable`), is finished, or
  waits in the standard library's code, at most `FORK_WAIT_S`. Parked there, a job thread is not inside the C++
  code of an operator it called: a child forked while it was had hung for good in the C++ guard of a static the
  job was initializing (an operator's first call), 1 fork in about 25 of
  `tests/aitune_jit/scripts/fork_while_tuning.py` under load on this CPU. The parked jobs go on after the fork.
  A job without a gate (`AITUNE_WORKER_YIELD_MS=0`, a traced thread, a warm rebuild on the CPU:
  `warm_rebuild_gate.running_freely`, and the set-up before its gate is on) is only waited for until it is outside any
  import; one seen waiting in the standard library's code may return into its own code and call an operator
  before the fork happens;
- in the child: dynamo's compile lock, if a thread that does not exist there holds it, is replaced by a fresh one
  (`torch._dynamo.convert_frame.compile_lock`, read by name at each compile); the nodes whose job was queued or
  running in the parent record again, with a fresh tuning lock where the job held theirs
  (`PatchedModule.reopen_after_fork`), so the child tunes them itself (or waits for a replica's claim:
  `replica_claims`);
- forks made by aitune's own threads are left alone.

What stays: a Python lock a parked job holds across calls that is neither of these (one of torch's own, inside a
compile) is inherited held, as is any lock of a job that has no gate or did not park within `FORK_WAIT_S`; and
global settings a compile patches for its duration (Inductor's config) keep the job's values in the child.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from aitune_jit import park_spots, worker, worker_yield

if TYPE_CHECKING:
    from aitune_jit.outcome import TuningNode

_logger = logging.getLogger("aitune.jit")
#: the longest a fork waits for the running job to finish the import it is in (seconds)
FORK_WAIT_S = 5.0

#: forking thread's ident -> the nodes whose job was queued or running when its fork began
_forking: dict[int, list[TuningNode]] = {}


def _before_fork() -> None:
    if threading.current_thread().name.startswith("aitune-"):  # (aitune's own threads fork only to run a program)
        return
    _forking[threading.get_ident()] = []  # (first: the parent's hook lets go only for such a fork)
    worker_yield.fork_begins()
    job, queued = worker.hold_for_fork(True)
    running = job is not None and not job.finished.is_set()
    node = job.node_ref() if running else None
    _forking[threading.get_ident()] = queued + ([node] if node is not None else [])
    jobs = [(thread, finished) for thread, finished in worker.live_job_threads()
            if thread is not threading.current_thread()]
    deadline = time.monotonic() + FORK_WAIT_S
    while True:
        states = {thread.name: _fork_state(thread, finished) for thread, finished in jobs}
        if all(state in _SAFE for state in states.values()) or time.monotonic() >= deadline:
            break
        worker_yield.wait_for_parking(0.002)
    if not all(state in _SAFE for state in states.values()):
        _logger.debug("fork: after %.0fs, tuning jobs were still %s", FORK_WAIT_S, states)


#: where a job thread holds no lock a child would inherit held (`_fork_state`)
_SAFE = ("parked", "finished", "waiting")
#: standard-library code a job thread runs while it waits for something else (its compile process, an event, a
#: lock): a thread whose innermost Python frame is there is in none of torch's C++ code
_STDLIB = os.path.dirname(threading.__file__)
_WAITING_FILES = frozenset(os.path.join(_STDLIB, *name.split("/")) for name in (
    "threading.py", "queue.py", "selectors.py", "subprocess.py", "concurrent/futures/_base.py",
    "multiprocessing/connection.py"))


def _fork_state(thread: threading.Thread, finished: threading.Event) -> str:
    """"parked" by its gate, "finished", "importing", "waiting" in the standard library's code (or, with no gate
    on it, anywhere outside an import) or "running"."""
    gate = worker_yield.gate_of(thread.ident)
    if gate == "parked":
        return "parked"
    frame = sys._current_frames().get(thread.ident) if thread.ident is not None else None
    if finished.is_set() or frame is None:
        return "finished"
    if park_spots.importing(frame):
        return "importing"
    if gate is None or frame.f_code.co_filename in _WAITING_FILES:
        return "waiting"
    return "running"


def _after_fork_in_parent() -> None:
    if _forking.pop(threading.get_ident(), None) is None:
        return
    try:
        worker_yield.fork_ended()
        worker.hold_for_fork(False)
    except Exception:  # (never: but a fork must not fail because of aitune)
        _logger.debug("resuming the tuning jobs after a fork failed", exc_info=True)


def _after_fork_in_child() -> None:
    nodes = _forking.pop(threading.get_ident(), [])
    _forking.clear()
    _free_dynamo_compile_lock()
    for node in nodes:
        try:
            node.reopen_after_fork()
        except Exception:
            _logger.debug("could not reopen %s after a fork", getattr(node, "path", node), exc_info=True)


def _free_dynamo_compile_lock() -> None:
    """In a forked child: dynamo's compile lock, held by a thread the child does not have, is replaced (this thread
    holding it, or nobody, leaves it as it is)."""
    convert_frame: Any = sys.modules.get("torch._dynamo.convert_frame")
    lock = getattr(convert_frame, "compile_lock", None)
    if lock is None:
        return
    try:
        if lock.acquire(blocking=False):
            lock.release()
            return
        convert_frame.compile_lock = threading.RLock()
    except Exception:
        _logger.debug("could not check dynamo's compile lock after a fork", exc_info=True)


def _timed_before_fork() -> None:
    start = time.monotonic()
    try:
        _before_fork()
    except Exception:  # a fork must never fail because of aitune
        _logger.debug("preparing the tuning worker for a fork failed", exc_info=True)
    took = time.monotonic() - start
    if took > 0.1:
        _logger.debug("fork: waited %.2fs for the tuning jobs to park", took)


_installed = False


def install() -> None:
    """Register the fork hooks (once per process: `os.register_at_fork` has no way to take them back; with JIT
    tuning off, `worker.hold_for_fork` finds no worker and they do nothing)."""
    global _installed
    if _installed or not hasattr(os, "register_at_fork"):
        return
    _installed = True
    os.register_at_fork(before=_timed_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
