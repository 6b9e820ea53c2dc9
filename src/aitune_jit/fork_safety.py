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
  until the running job is between two imports, at most `FORK_WAIT_S` (a job stepping aside for a request made by
  the forking thread cannot finish its import: the fork then goes on after that wait);
- in the child: dynamo's compile lock, if a thread that does not exist there holds it, is replaced by a fresh one
  (`torch._dynamo.convert_frame.compile_lock`, read by name at each compile); the nodes whose job was queued or
  running in the parent record again, with a fresh tuning lock where the job held theirs
  (`PatchedModule.reopen_after_fork`), so the child tunes them itself (or waits for a replica's claim:
  `replica_claims`);
- forks made by aitune's own threads are left alone.

What stays: a lock the job holds that is neither of these (one of torch's own, inside a compile) is inherited held,
and global settings a compile patches for its duration (Inductor's config) keep the job's values in the child.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from aitune_jit import worker

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
    _forking[threading.get_ident()] = []  # (first: the parent's hook releases the worker only for such a fork)
    job, queued = worker.hold_for_fork(True)
    running = job is not None and not job.finished.is_set()
    node = job.node_ref() if running else None
    _forking[threading.get_ident()] = queued + ([node] if node is not None else [])
    if not running or job.thread is threading.current_thread():
        return
    deadline = time.monotonic() + FORK_WAIT_S
    while _importing(job.thread) and time.monotonic() < deadline:
        time.sleep(0.002)
    if _importing(job.thread):
        _logger.debug("fork: the tuning job of %s was still importing after %.0fs", job.path, FORK_WAIT_S)


def _importing(thread: threading.Thread | None) -> bool:
    """Whether `thread` is inside an import now (it holds that module's import lock)."""
    frame = sys._current_frames().get(thread.ident) if thread is not None and thread.ident is not None else None
    while frame is not None:
        if frame.f_code.co_name == "_find_and_load" and "importlib._bootstrap" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _after_fork_in_parent() -> None:
    if _forking.pop(threading.get_ident(), None) is None:
        return
    try:
        worker.hold_for_fork(False)
    except Exception:  # (never: but a fork must not fail because of aitune)
        _logger.debug("resuming the tuning worker after a fork failed", exc_info=True)


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
        _logger.debug("fork: waited %.2fs for the tuning job's imports", took)


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
