"""Modules whose parameters and buffers `torch.func.functional_call` has swapped for the call's own tensors, now.

Why: `functional_call(model, params, x)` puts `params` into the module tree in place (for every thread) for the
length of the call (`torch.nn.utils.stateless._reparametrize_module`). Recorded, such a call became a sample whose
reference output came from other weights than the module's own; dispatched, it missed the compiled graph. On this
project's CPU a BERT called that way now and then, under blocking tuning, was tuned again after eight such
misses, and that tuning failed validation ("recorded calls no longer match the module") and left the model eager
for good, with the whole ValidationError in the summary. Its calls under `functional_call` now run the original
module and are not recorded, as calls under `vmap` and calls with gradients are (`node_recording._recordable`).

`install()` wraps `_reparametrize_module` (one `Patch`, `uninstall()` takes it off): while it is entered, every
module of the tree counts as swapped (`swapped(module)`). Inside dynamo's trace (a program's own compiled
function that calls `functional_call`) the wrapper calls torch's own directly, so the trace is what it was.
A background job that traces the module while it is swapped is not held off: its build fails or its
validation does, and the module is tuned from later calls or stays eager.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from aitune_core.patch import Patch

_swapped: dict[int, int] = {}  # id(module) -> how many reparametrizations of it are entered now
_lock = threading.Lock()
_patch: Patch | None = None


def swapped(module: torch.nn.Module) -> bool:
    """Whether `module`'s parameters are swapped by a `functional_call` now (any thread's)."""
    return bool(_swapped) and id(module) in _swapped


@contextlib.contextmanager
def _marked(original: Callable[..., Any], module: torch.nn.Module, *args: Any, **kwargs: Any) -> Iterator[None]:
    ids = [id(m) for m in module.modules()]
    with _lock:
        for key in ids:
            _swapped[key] = _swapped.get(key, 0) + 1
    try:
        with original(module, *args, **kwargs):
            yield
    finally:
        with _lock:
            for key in ids:
                left = _swapped.get(key, 1) - 1
                if left > 0:
                    _swapped[key] = left
                else:
                    _swapped.pop(key, None)


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def reparametrize_module(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return original(module, *args, **kwargs)
        return _marked(original, module, *args, **kwargs)

    return reparametrize_module


def install() -> None:
    """Wrap torch's `_reparametrize_module` (idempotent; nothing where this torch has none)."""
    global _patch
    from torch.nn.utils import stateless

    original = stateless.__dict__.get("_reparametrize_module")
    if _patch is not None or original is None:
        return
    _patch = Patch(stateless, "_reparametrize_module", _wrap(original)).apply()


def uninstall() -> None:
    """Put torch's own back (unless another tool replaced it since: then theirs stays)."""
    global _patch
    if _patch is not None:
        _patch.restore()
        _patch = None
