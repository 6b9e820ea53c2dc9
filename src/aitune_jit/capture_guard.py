"""A device-wide CUDA synchronization waits while another thread captures a CUDA graph.

Why: CUDA forbids synchronizing the device while any stream is being captured, whatever the capture mode: the
synchronizing call fails ("operation not permitted when stream is capturing") and the capture is invalidated.
Background tuning makes that reachable from a correct program: the job thread captures CUDA graphs when it
validates and measures a `reduce-overhead` candidate, while the application calls `torch.cuda.synchronize()`
after each request; and the application's first calls of a tuned CUDA-graph backend record graphs while the job
thread synchronizes to time another candidate. Seen on an H100: every request loop that synchronized after each
call crashed while the worker validated ResNet-50's CUDA-graph candidate.

How: while installed (from the first background job on; `install` / `uninstall`), `torch.cuda.CUDAGraph`'s
`capture_begin` / `capture_end` count open captures per thread, and `torch.cuda.synchronize` waits until no
other thread captures (at most `MAX_WAIT_S`, then it synchronizes anyway); a capture does not begin while another
thread synchronizes the device. Code that imported `synchronize` by name before installation is not covered.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

from aitune_core.patch import Patch

_logger = logging.getLogger("aitune.jit")

#: longest wait of a synchronization for another thread's capture (a capture takes milliseconds)
MAX_WAIT_S = 10.0

_cond = threading.Condition(threading.Lock())
_captures: dict[int, int] = {}  # thread ident -> captures open in it
_syncs: dict[int, int] = {}  # thread ident -> device synchronizations running in it
_patches: list[Patch] = []


def _others(table: dict[int, int], me: int) -> bool:
    return any(count for ident, count in table.items() if ident != me)


def capturing_here() -> bool:
    """True while this thread captures a CUDA graph (a paused capture would make every device sync wait)."""
    return capturing_in(threading.get_ident())


def capturing_in(ident: int) -> bool:
    """True while thread `ident` captures a CUDA graph: an exception raised into it now would end the capture
    half-way (the exit cancel waits for the capture to end: `aitune_jit.worker`)."""
    return bool(_captures.get(ident))


def _enter(table: dict[int, int], other: dict[int, int], what: str) -> int:
    me = threading.get_ident()
    with _cond:
        if not _cond.wait_for(lambda: not _others(other, me), MAX_WAIT_S):
            _logger.debug("%s went ahead after waiting %gs for another thread", what, MAX_WAIT_S)
        table[me] = table.get(me, 0) + 1
    return me


def _leave(table: dict[int, int], me: int) -> None:
    with _cond:
        count = table.get(me, 0) - 1
        if count > 0:
            table[me] = count
        else:
            table.pop(me, None)
        _cond.notify_all()


def _guarded_synchronize(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def synchronize(*args: Any, **kwargs: Any) -> Any:
        me = _enter(_syncs, _captures, "torch.cuda.synchronize")
        try:
            return original(*args, **kwargs)
        finally:
            _leave(_syncs, me)

    return synchronize


def _counted_begin(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        me = _enter(_captures, _syncs, "a CUDA graph capture")
        try:
            return original(self, *args, **kwargs)
        except BaseException:
            _leave(_captures, me)
            raise

    return capture_begin


def _counted_end(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        finally:
            _leave(_captures, threading.get_ident())

    return capture_end


def install() -> None:
    """Guard device synchronizations against other threads' captures (idempotent; nothing without CUDA graphs)."""
    graph_class = getattr(torch.cuda, "CUDAGraph", None)
    with _cond:
        if _patches or graph_class is None or not hasattr(graph_class, "capture_begin"):
            return
        _patches.extend([
            Patch(torch.cuda, "synchronize", _guarded_synchronize(torch.cuda.synchronize)).apply(),
            Patch(graph_class, "capture_begin", _counted_begin(graph_class.capture_begin)).apply(),
            Patch(graph_class, "capture_end", _counted_end(graph_class.capture_end)).apply(),
        ])


def uninstall() -> None:
    """Put torch's functions back (a newer patch of one of them by someone else stays)."""
    with _cond:
        for patch in reversed(_patches):
            if not patch.restore():
                _logger.debug("%r was patched again after aitune; leaving the newer patch", patch)
        _patches.clear()


def installed() -> bool:
    return bool(_patches)
