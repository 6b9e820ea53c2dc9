"""While TorchScript compiles a module, aitune's forward slots in its tree are off.

Why: `torch.jit.script(module)` reads each module's `forward` as Python source (`inspect.getsource` of
`module.forward`). A module aitune records or has tuned has a `ForwardSlot` there, an object with no source, so
scripting a model after it had served a few calls raised "TypeError: module, class, method, function, traceback,
frame, or code object was expected, got SlotForward" into the program (a reviewer's deployment script). A
TorchScript module is compiled from the source and never calls the Python forward afterwards, so nothing of
aitune's belongs in it.

How: torch's `torch.jit._recursive.create_script_module` (what `torch.jit.script` calls for a module, however it
was imported) is wrapped while `install()` holds: every slot in the module's tree is suspended for the call
(`ForwardSlot.suspended`), so TorchScript sees the user's forward; the slots are back when it returns. Calls of
the module from other threads meanwhile run its own forward, which computes the same.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

from aitune_core.forward_slot import ForwardSlot
from aitune_core.patch import Patch

_lock = threading.Lock()
_patch: Patch | None = None
_users = 0


def _with_slots_suspended(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def create_script_module(nn_module: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(nn_module, torch.nn.Module):
            return original(nn_module, *args, **kwargs)
        with contextlib.ExitStack() as stack:
            for sub in nn_module.modules():
                slot = ForwardSlot.of(sub)
                if slot is not None:
                    stack.enter_context(slot.suspended())
            return original(nn_module, *args, **kwargs)

    create_script_module.__aitune_torchscript_slots__ = True  # type: ignore[attr-defined]
    return create_script_module


def install() -> None:
    """Wrap TorchScript's module compile (counted: each `install()` is undone by one `uninstall()`)."""
    global _patch, _users
    with _lock:
        _users += 1
        if _patch is not None:
            return
        from torch.jit import _recursive

        current = _recursive.create_script_module
        if not getattr(current, "__aitune_torchscript_slots__", False):
            _patch = Patch(_recursive, "create_script_module", _with_slots_suspended(current)).apply()


def uninstall() -> None:
    global _patch, _users
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _patch is not None:
            _patch.restore()
            _patch = None


def installed() -> bool:
    return _patch is not None
