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
first call like any other. A class with a `__getstate__` of its own (`d = self.__dict__.copy(); ...; return d`)
bypasses that: its shallow copies answered with the original's attributes (seventh review, 2026-11-26). So
`torch.nn.Module.__setstate__`, which rebuilds every copy and unpickled module, drops them too: the node or
marker, and a forward slot that is not the new module's own. A class with its own `__setstate__` as well is not
covered. `torch.nn.DataParallel`'s replicas (`Module._replicate_for_data_parallel`) copy the instance dict
without either: each replica called the original's slot, so it ran the original module on the original's weights
(a wrong answer on the CPU, "mat1 is on cuda:1, different from other tensors on cuda:0" on two GPUs); replicas
are cleaned the same way.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

from aitune_core.forward_slot import ForwardSlot, SlotForward
from aitune_core.patch import Patch
from aitune_jit.runtime import NODE_ATTR

_lock = threading.Lock()
_patches: dict[str, Patch] = {}


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


def _taking_aitune_out(original: Callable[[torch.nn.Module, Any], None]) -> Callable[[torch.nn.Module, Any], None]:
    @functools.wraps(original)
    def __setstate__(self: torch.nn.Module, state: Any) -> None:
        if isinstance(state, dict):  # (a slot copied by a `__getstate__` of the class: not this module's own)
            state = _without_aitune(state)
        original(self, state)

    __setstate__.__aitune_module_copies__ = True  # type: ignore[attr-defined]
    return __setstate__


def _without_aitune(state: dict[str, Any]) -> dict[str, Any]:
    """`state` (an instance dict) without aitune's node or marker and a forward slot copied into it."""
    if NODE_ATTR not in state and not isinstance(state.get("forward"), SlotForward):
        return state
    state = dict(state)
    state.pop(NODE_ATTR, None)
    forward = state.get("forward")
    if isinstance(forward, SlotForward):  # (the copied module's slot)
        state = forward._slot.state_without(state)
    return state


def _replicas_clean(original: Callable[[torch.nn.Module], Any]) -> Callable[[torch.nn.Module], Any]:
    @functools.wraps(original)
    def _replicate_for_data_parallel(self: torch.nn.Module) -> Any:
        replica = original(self)
        state = vars(replica)
        cleaned = _without_aitune(state)
        if cleaned is not state:
            state.clear()
            state.update(cleaned)
        return replica

    _replicate_for_data_parallel.__aitune_module_copies__ = True  # type: ignore[attr-defined]
    return _replicate_for_data_parallel


_WRAPPERS = (("__getstate__", _leaving_aitune_out), ("__setstate__", _taking_aitune_out),
             ("_replicate_for_data_parallel", _replicas_clean))


def install() -> None:
    """Leave aitune's attributes out of every module's state and every rebuilt module (idempotent)."""
    with _lock:
        for name, wrap in _WRAPPERS:
            current = getattr(torch.nn.Module, name, None)
            if current is None:  # (a torch without DataParallel's replica hook)
                continue
            if name not in _patches and not getattr(current, "__aitune_module_copies__", False):
                _patches[name] = Patch(torch.nn.Module, name, wrap(current)).apply()


def uninstall() -> None:
    with _lock:
        for patch in _patches.values():
            patch.restore()
        _patches.clear()


def installed() -> bool:
    return bool(_patches)
