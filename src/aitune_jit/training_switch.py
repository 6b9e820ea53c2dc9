"""A background job stops when the program switches the module it tunes to training mode.

Why: only inference calls are recorded, but a job replays them on the program's own module. A program that
evaluates and then trains (validation inside a training loop, online learning) can call `model.train()` while a
job runs; the job's next replays then ran in training mode: BatchNorm's running statistics moved and dropout took
random numbers from the program's generator, so the training that followed differed from a run without aitune
(a reviewer's script: `num_batches_tracked` 26 instead of 2 after the first step, every loss different).

How: while jobs run, `torch.nn.Module.train` is wrapped (`aitune_core.patch.Patch`, on while any job watches, off
with the last). A call that switches a module inside a watched job's module tree to training mode, from any thread
but the job's own, calls that job's `stop` at once: the worker raises `TrainingSwitched` at the job thread's next
Python function start through its step-aside gate, before a training-mode layer runs there. The job's outcome is
dropped and the node records again from its next inference calls. A job without a gate (`AITUNE_WORKER_YIELD_MS=0`)
is not stopped; a replay already inside a layer's kernel finishes it.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from aitune_core.patch import Patch
from aitune_jit.job_cancel import TuningCancelled, catch_unraisable_cancels
from aitune_jit.node_registry import registry


class TrainingSwitched(TuningCancelled):
    """Raised inside a job thread when the program switched its module to training mode."""


class _Watch:
    __slots__ = ("ids", "stop", "thread")

    def __init__(self, module: torch.nn.Module, stop: Callable[[], None]) -> None:
        self.ids = frozenset(id(m) for m in module.modules())
        self.stop = stop
        self.thread = threading.get_ident()


_lock = threading.Lock()
_watches: list[_Watch] = []
_patch: Patch | None = None


def watch(module: torch.nn.Module, stop: Callable[[], None]) -> Callable[[], None]:
    """Call `stop()` when another thread switches `module` or a submodule to training mode; returns the function
    that ends the watch (call it when the job ends)."""
    global _patch
    entry = _Watch(module, stop)
    with _lock:
        _watches.append(entry)
        if _patch is None:
            _patch = Patch(torch.nn.Module, "train", _wrap(torch.nn.Module.train)).apply()

    def end() -> None:
        global _patch
        with _lock:
            if entry in _watches:
                _watches.remove(entry)
            if not _watches and _patch is not None:
                _patch.restore()
                _patch = None

    return end


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def train(self: torch.nn.Module, mode: bool = True) -> Any:
        result = original(self, mode)
        if mode and _watches:
            _switched(self)
        return result

    return train


def _switched(module: torch.nn.Module) -> None:
    here, key = threading.get_ident(), id(module)
    for entry in list(_watches):
        if entry.thread != here and key in entry.ids:
            entry.stop()


@contextlib.contextmanager
def watching(module: torch.nn.Module | None, job: Any) -> Iterator[None]:
    """While the block runs (a job's body, on its thread), stop `job` through its step-aside gate (`job.gate`,
    read when it fires) if the program switches `module` to training mode; said once in the history."""
    if module is None:
        yield
        return
    fired: list[bool] = []

    def stop() -> None:
        gate = job.gate
        if not fired and gate is not None:
            catch_unraisable_cancels()  # (raised at a function start, it can land in a finalizer)
        if not fired and gate is not None and gate.cancel(TrainingSwitched):
            fired.append(True)
            registry.log(f"{job.path}: tuning stopped: the program switched it to training mode while it was tuned "
                         "(replays would have run in training mode); it is tuned again from its next inference calls")

    end = watch(module, stop)
    try:
        yield
    finally:
        end()
