"""A copy of a module aitune watches - `copy.copy`, `copy.deepcopy`, a pickle - carries nothing of aitune's.

Why: aitune keeps up to two instance attributes on a module it watches: the node or marker (`runtime.NODE_ATTR`)
and, while the module records or is tuned, its forward slot (`aitune_core.forward_slot`). `copy.copy` copies the
instance dict as it is, so a shallow copy shared the original's node and slot, and its calls ran the original
module (a reviewer's script: a copy whose scale attribute was set to 50 answered with the original's 1.0). A
pickle of the module carried `builtins.getattr` (the slot's own reduce) and `NoneType` (a marker's), which
`torch.load(weights_only=True)` refuses even with the module's classes allowed.

How: while the hook is installed, `torch.nn.Module.__getstate__` - torch's own leaves out `_compiled_call_impl`
in the same way - also leaves out aitune's node or marker and its forward slot (the user's own instance
forward, if one was set, is what the copy gets). A copy is then a module aitune has not seen: adopted on its
first call like any other. A class with a `__getstate__` of its own is not covered; its copies keep the
per-object reduces (`PatchedModule.__reduce_ex__`, `SlotForward.__reduce_ex__`), as before.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

from aitune_core.forward_slot import ForwardSlot
from aitune_core.patch import Patch
from aitune_jit.runtime import NODE_ATTR

_lock = threading.Lock()
_patch: Patch | None = None


def _leaving_aitune_out(original: Callable[[torch.nn.Module], Any]) -> Callable[[torch.nn.Module], Any]:
    @functools.wraps(original)
    def __getstate__(self: torch.nn.Module) -> Any:
        state = original(self)
        if not isinstance(state, dict):
            return state
        state.pop(NODE_ATTR, None)
        slot = ForwardSlot.of(self)
        return slot.state_without(state) if slot is not None else state

    __getstate__.__aitune_module_copies__ = True  # type: ignore[attr-defined]
    return __getstate__


def install() -> None:
    """Leave aitune's attributes out of every module's state (idempotent)."""
    global _patch
    with _lock:
        current = torch.nn.Module.__getstate__
        if _patch is None and not getattr(current, "__aitune_module_copies__", False):
            _patch = Patch(torch.nn.Module, "__getstate__", _leaving_aitune_out(current)).apply()


def uninstall() -> None:
    global _patch
    with _lock:
        if _patch is not None:
            _patch.restore()
            _patch = None


def installed() -> bool:
    return _patch is not None
