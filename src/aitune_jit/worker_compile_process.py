"""Inductor's code generation in a separate process while a background tuning job runs (opt-in).

Why it exists: a tuning job shares one GIL with the threads that serve requests, and a good part of an Inductor
compile is CPython bytecode (lowering, scheduling, code generation); another process has its own interpreter.
On this 2-core CPU (a 4-layer BERT served every 10 ms while a 6-layer BERT compiled) it lowered the slowest
request from 343 to 65 ms. Why it is off by default: on an H100 serving ResNet-50 and BERT-base
(`benchmarks/probes/background_tuning.py`, contenders `jit-cold` and `jit-cold-thread`, results
`background_tuning-h100-*-subprocess-bcb4a70.json` and `-place-21291eb.json`) it changed no latency figure beyond
run-to-run noise, because dynamo's trace, AOTAutograd, loading the generated code, validation and measurement
stay on the job thread; and with the job stepping aside for requests (`worker_yield`) it made tuning slower
(ResNet-50 tuned after 70.0 s against 50.6 s): the spawn, the pickling of the graph and its fake inputs and the
return trip are paid while the job gets only idle moments.

torch ships the mechanism: `torch._inductor.compile_fx.fx_compile_mode` (`TORCHINDUCTOR_FX_COMPILE_MODE=
subprocess`). Each graph that AOTAutograd hands to Inductor is pickled to one spawned compile process
(`_SubprocessFxCompile`), whose generated code comes back and is loaded here; a graph that cannot be pickled is
compiled in this process as before. Inductor's caches are shared with that process.

The mode is one module-level value of torch, read at each compile: it is set while a job runs and restored
when the last running job ends (a compile the application starts itself meanwhile also goes to the compile
process, with the same result). A program that chose a mode itself (`TORCHINDUCTOR_FX_COMPILE_MODE`) keeps it.
The compile process is started at the job's start, so its start-up overlaps the job's dynamo trace. If it dies,
the jobs after it compile in this process (one warning). A forked child gets the mode the parent had before
any job.

`AITUNE_WORKER_COMPILE`: `thread` (default: compile on the job thread) or `subprocess`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

from aitune_jit.worker_env import env_choice

_logger = logging.getLogger("aitune.jit")

PLACES = ("subprocess", "thread")

_lock = threading.Lock()
_active = 0  # jobs inside `compiles_in_subprocess()` (an abandoned job may still be running)
_saved_mode: Any = None
_broken = False  # the compile process died: compile in this process from now on


def compile_place() -> str:
    """`AITUNE_WORKER_COMPILE`: where a background job's Inductor compiles run (module docstring)."""
    return env_choice("AITUNE_WORKER_COMPILE", PLACES, "thread")


def _torch_compile_fx() -> Any | None:
    """torch's `compile_fx` module when it has the subprocess mode, else None (another torch)."""
    try:
        import torch._inductor.compile_fx as compile_fx
        from torch._inductor.compile_fx_subproc import _SubprocessFxCompile  # noqa: F401
    except Exception:
        return None
    modes = getattr(compile_fx, "FxCompileMode", None)
    if modes is None or not hasattr(modes, "SUBPROCESS") or not hasattr(compile_fx, "fx_compile_mode"):
        return None
    return compile_fx


def _pool() -> Any:
    from torch._inductor.compile_fx_subproc import _SubprocessFxCompile

    return _SubprocessFxCompile.process_pool()


@contextlib.contextmanager
def compiles_in_subprocess() -> Iterator[bool]:
    """Run a job with Inductor's code generation in the compile process; yields whether it is on."""
    on = _enter()
    try:
        yield on
    finally:
        if on:
            _leave()


def _enter() -> bool:
    global _active, _saved_mode
    if _broken or compile_place() != "subprocess":
        return False
    compile_fx = _torch_compile_fx()
    if compile_fx is None:
        _logger.debug("this torch has no subprocess compile mode: compiling on the job thread")
        return False
    with _lock:
        if _active == 0:
            if compile_fx.fx_compile_mode != compile_fx.FxCompileMode.NORMAL:
                return False  # the program chose a mode itself
            _saved_mode = compile_fx.fx_compile_mode
            compile_fx.fx_compile_mode = compile_fx.FxCompileMode.SUBPROCESS
        _active += 1
    try:
        started = _start_pool()
    except BaseException:  # the job cancelled at exit (worker.TuningCancelled) while the process starts
        _leave()
        raise
    if not started:
        _leave()
    return started


def _start_pool() -> bool:
    """Start the compile process now (it imports torch while the job traces); False if it is not usable."""
    global _broken
    try:
        pool = _pool()
    except Exception:
        _logger.debug("could not start Inductor's compile process", exc_info=True)
        pool = None
    if pool is not None and getattr(pool, "running", True):
        return True
    if not _broken:
        _broken = True
        _logger.warning("aitune: Inductor's compile process is not running; later tuning jobs compile in this "
                        "process, where they slow concurrent requests more")
    return False


def _leave() -> None:
    global _active, _saved_mode
    compile_fx = _torch_compile_fx()
    with _lock:
        _active -= 1
        if _active == 0 and compile_fx is not None and _saved_mode is not None:
            compile_fx.fx_compile_mode = _saved_mode
            _saved_mode = None


def _after_fork_in_child() -> None:
    """The parent's compile process is not the child's to use (its pipes are the parent's): the child starts
    with the mode the parent had before any job and starts a compile process of its own when it needs one.

    Inductor's compile threads (`AsyncCompile.pool`, made by the parent's first compile) are not the child's
    either: torch's own after-fork hook resets its process pool but not that thread pool, whose threads do not
    exist in the child, so the child's first compile waited for them forever. A DataLoader worker whose dataset
    calls a model hung that way under `AITUNE_JIT_BLOCKING=1` once the parent had tuned a model. The child makes
    a pool of its own."""
    global _active, _saved_mode, _lock
    _lock = threading.Lock()
    async_compile = sys.modules.get("torch._inductor.async_compile")
    if async_compile is not None:
        with contextlib.suppress(Exception):
            async_compile.AsyncCompile.pool.cache_clear()
    compile_fx = _torch_compile_fx() if "torch._inductor.compile_fx_subproc" in sys.modules else None
    if compile_fx is not None:
        if _saved_mode is not None:
            compile_fx.fx_compile_mode = _saved_mode
        with contextlib.suppress(Exception):
            sys.modules["torch._inductor.compile_fx_subproc"]._SubprocessFxCompile.process_pool.cache_clear()
    _active = 0
    _saved_mode = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
