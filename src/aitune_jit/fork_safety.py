"""A fork while a tuning job runs: the job is cancelled first, so that the child inherits no lock the job holds.

Why: a job holds locks while it compiles - dynamo's compile lock, the import lock of each module it imports (torch
imports its compiler lazily), the root's tuning lock - and `fork()` copies them held into a child whose threads
will never release them. A child forked while the worker compiled (a DataLoader worker, a gunicorn worker forked
after warm-up requests, `multiprocessing` with the fork start method) hung for good on its first import of such a
module or its first compile: on this project's CPU a child's own `torch.compile` waited more than 90 s on a module
lock, in the parent a job tuning an MLP with Inductor.

So before each fork (`os.register_at_fork`), the worker starts no new job and the running one is cancelled where it
can stop cleanly: `TuningCancelled` at the job thread's next Python function start (`job_cancel`, step 1), so every
`finally` and context manager it unwinds through releases what it holds; the fork waits for that at most
`FORK_WAIT_S`. Before its step-aside gate is on, a job only imports torch's compiler (and primes it: `worker`):
the fork then waits until the job is between two imports. There is no asynchronous cancel here (the program goes
on, and one landing in a cleanup could leave torch's state half changed): a job inside a long C call past that
wait is cancelled after the fork, and the child inherits what it held, as before. After the fork the parent's
worker goes on (the cancelled node records again and is tuned by a later job); the child has no worker
(`worker._after_fork_in_child`), and the nodes that were queued in the parent record again there, so the child
tunes them itself (or waits for a replica's claim: `replica_claims`). The hooks skip forks made by aitune's own
threads. A node's job is stopped by a fork once: a program that forks more often than a compile lasts (a fresh
DataLoader iterator per shard) would otherwise keep it from ever being tuned; a later fork during its next job
only waits until that job is between two imports, and the child inherits the locks the job holds, as before.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING

from aitune_jit import worker
from aitune_jit.job_cancel import TuningCancelled
from aitune_jit.node_registry import registry

if TYPE_CHECKING:
    from aitune_jit.outcome import TuningNode

_logger = logging.getLogger("aitune.jit")
#: the longest a fork waits for the running job to unwind from its cancel (seconds)
FORK_WAIT_S = 5.0

_queued: list[TuningNode] = []  # nodes queued when the fork began (the child records them again)


def _before_fork() -> None:
    if threading.current_thread().name.startswith("aitune-"):  # (aitune's own threads fork only to run a program)
        return
    job, queued = worker.hold_for_fork(True)
    _queued[:] = queued
    if job is None or job.finished.is_set() or job.thread is threading.current_thread():
        return
    deadline = time.monotonic() + FORK_WAIT_S
    while job.gate is None and _importing(job.thread) and time.monotonic() < deadline:
        time.sleep(0.005)  # (before its gate, the job imports torch's compiler: those imports end first)
    node = job.node_ref()
    if node is None or id(node) in _stopped_once:  # (a program that forks often must not keep it from ever tuning)
        return
    gate = job.gate
    if gate is None or not gate.cancel(TuningCancelled):  # (no gate: between its imports it holds no lock)
        return
    _stopped_once.add(id(node))
    job.abandoned = True  # its outcome is neither applied nor stored; its node records again
    if not job.finished.wait(max(0.0, deadline - time.monotonic())):
        _logger.debug("fork: the tuning job of %s did not stop within %.0fs", job.path, FORK_WAIT_S)
        return
    node.job_dropped()  # (cancelled before its node's own clean-up ran, it would stay queued for good)
    if job.path not in _fork_notes:
        _fork_notes.add(job.path)
        registry.log(f"The program forks while {job.path} is tuned: that tuning stopped first (the child must not "
                     "inherit the locks it held) and starts again on a later call")


_fork_notes: set[str] = set()
#: ids of the nodes whose job a fork stopped: a later fork during their next job only waits for its imports
_stopped_once: set[int] = set()


def _importing(thread: threading.Thread | None) -> bool:
    """Whether `thread` is inside an import now (it holds that module's import lock)."""
    frame = sys._current_frames().get(thread.ident) if thread is not None and thread.ident is not None else None
    while frame is not None:
        if frame.f_code.co_name == "_find_and_load" and "importlib._bootstrap" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _after_fork_in_parent() -> None:
    _queued.clear()
    try:
        worker.hold_for_fork(False)
    except Exception:  # (never: but a fork must not fail because of aitune)
        _logger.debug("resuming the tuning worker after a fork failed", exc_info=True)


def _after_fork_in_child() -> None:
    """The nodes queued in the parent have no job here: they record again (the child queues them itself)."""
    for node in _queued:
        try:
            node.job_dropped()
        except Exception:
            _logger.debug("could not reopen %s after a fork", getattr(node, "path", node), exc_info=True)
    _queued.clear()


def _timed_before_fork() -> None:
    start = time.monotonic()
    try:
        _before_fork()
    except Exception:  # a fork must never fail because of aitune
        _logger.debug("preparing the tuning worker for a fork failed", exc_info=True)
    took = time.monotonic() - start
    if took > 0.1:
        _logger.debug("fork: the tuning worker took %.2fs to stop", took)


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
