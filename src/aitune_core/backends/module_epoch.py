"""The module epoch: one process-wide counter that moves whenever a module's structure, mode or hooks may change.

A tuned module must notice, at its next call, that the model changed under it (a hook registered on a child, a
submodule replaced, `.train()`, `.to(dtype)`, `load_state_dict`). Walking the module tree on every call would cost
far more than the dispatch itself, so the torch methods that make such changes are patched to bump one integer,
and a tuned module's per-call check compares that integer with the value it saw last (`ModuleWatch.stale`).

What bumps the epoch (each patch is one `_Patch` record holding the exact original, put back by `release`):
- `Module.register_forward_hook` / `register_forward_pre_hook` / `register_full_backward_hook` /
  `register_full_backward_pre_hook` / `register_backward_hook`, the global `register_module_forward_hook` /
  `register_module_forward_pre_hook`, and `RemovableHandle.remove` (every hook removal);
- `Module.train` (so `eval` too) when a flag actually changes; `Module._apply` (`to`, `cuda`, `half`, ...);
  `Module.load_state_dict`;
- `Module.__setattr__` of a Module, a Parameter, a registered buffer, a changed `training` flag (a program that
  sets `m.dropout.training = True` itself, without `train()`) or an instance `forward` (accelerate's hooks),
  `Module.__delattr__`, `add_module`, `register_module`, `register_parameter`, `register_buffer`: only on a
  module of a watched tree (`watch_tree`).
  A forward that slices a `ModuleList` (`self.resnets[1:]` in diffusers, `self.layers[:n]` in transformers'
  LLaMA) builds a new container on every call; its `add_module` moved the epoch, and where that code runs in
  Python (a backend running the original forward, the eager parts of a graph with breaks) every call of the
  tuned module compared a fresh snapshot of its whole tree (a tiny UNet: 11.9 ms a call against 11.1 plainly).
  A change to a module outside the watched trees cannot matter to a tuned module until it is put into one,
  which is a change of a watched module;
- `Module.__setattr__` that changes a plain number, string or flag of a module some backend exported with its
  values (`watch_values`: `LayerNorm.eps` is a constant of an ONNX graph; eighth review, 2026-11-26). Only
  such modules: a module elsewhere that counts its calls does not move the epoch on every call.

Nothing bumps while dynamo traces (`torch.compiler.is_compiling()`): a compiled forward that builds a temporary
module (transformers' LLaMA slices its `ModuleList` of layers on every call) would otherwise carry the increment
as a side effect and a guard on the counter's value, so every call of the compiled graph would compile it again.

In-place edits of a tensor's values (`weight.mul_(0)`, `load_state_dict` without `assign`) do not go through
any of these: the version counters of the tensors catch them (`ModuleWatch`), for the backends that need it.

The patches exist only while aitune has a tuned module alive: every `ModuleWatch` holds a reference
(`acquire`), released when it is garbage collected; the last release restores every original exactly.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from aitune_core.patch import Patch

_logger = logging.getLogger("aitune.backend.module_epoch")

__all__ = ["EPOCH", "PLAIN", "acquire", "bump", "installed", "release", "unwatch_tree", "unwatch_values", "watch_tree",
           "watch_values"]


class _Epoch:
    """A mutable integer: `EPOCH.value`. (A slot read is the cheapest thing a per-call check can do.)"""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


EPOCH = _Epoch()


def bump() -> None:
    """Something a tuned module may depend on changed: every watch re-checks at its next call."""
    EPOCH.value += 1  # a lost increment under a race is harmless: any increment makes every watch re-check


_lock = threading.Lock()
_users = 0
_patches: list[Patch] = []

_HOOK_REGISTRATIONS = (
    "register_forward_hook",
    "register_forward_pre_hook",
    "register_full_backward_hook",
    "register_full_backward_pre_hook",
    "register_backward_hook",
)
_STRUCTURE_METHODS = ("__delattr__", "add_module", "register_module", "register_parameter", "register_buffer")
#: called on a parent of the tuned module too (they recurse without calling the children's own method)
_WHOLE_MODULE_METHODS = ("_apply", "load_state_dict")
_GLOBAL_HOOK_FUNCTIONS = ("register_module_forward_hook", "register_module_forward_pre_hook")


def _bump_unless_traced() -> None:
    if not torch.compiler.is_compiling():  # see the module docstring
        EPOCH.value += 1


def _bumping(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def method(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            _bump_unless_traced()

    return method


def _bumping_in_trees(original: Callable[..., Any]) -> Callable[..., Any]:
    """A structure method of a module: the epoch moves only when the module is in a watched tree."""

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        finally:
            if id(self) in _TREE_WATCHED:
                _bump_unless_traced()

    return method


def _train(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def train(self: torch.nn.Module, mode: bool = True) -> Any:
        if self.__dict__.get("training") is not mode:  # `model.eval()` before every request costs nothing
            _bump_unless_traced()
        return original(self, mode)

    return train


def _setattr(original: Callable[..., Any]) -> Callable[..., Any]:
    module_type = torch.nn.Module
    tensor_type = torch.Tensor

    @functools.wraps(original)
    def __setattr__(self: torch.nn.Module, name: str, value: Any) -> None:
        # plain tensors set in forward (caches) are not state: only modules, parameters and registered buffers are
        state = self.__dict__
        if (id(self) in _TREE_WATCHED and (isinstance(value, module_type) or (
            isinstance(value, tensor_type)
            and (isinstance(value, torch.nn.Parameter) or name in state.get("_buffers", ()))
        ) or (value is None and (name in state.get("_modules", ()) or name in state.get("_parameters", ()))) or (
            name == "training" and value != state.get("training")  # `m.drop.training = True` (MC dropout)
        ) or name == "forward")) or (  # an instance forward (accelerate's hooks, a monkeypatch)
            id(self) in _VALUE_WATCHED and type(value) in PLAIN and state.get(name, _MISSING) != value):
            _bump_unless_traced()
        original(self, name, value)

    return __setattr__


PLAIN = (bool, int, float, str)
_MISSING = object()
_VALUE_WATCHED: collections.Counter[int] = collections.Counter()  # id(module) -> watches of its plain values
_TREE_WATCHED: collections.Counter[int] = collections.Counter()  # id(module) -> watches whose tree holds it


def watch_tree(modules: list[torch.nn.Module]) -> list[int]:
    """Move the epoch when the structure of one of `modules` changes (until `unwatch_tree` of the ids returned).
    A module that dies and whose id is reused stays counted until then: an extra move, never a missed one."""
    ids = [id(m) for m in modules]
    with _lock:
        _TREE_WATCHED.update(ids)
    return ids


def unwatch_tree(ids: list[int]) -> None:
    with _lock:
        _TREE_WATCHED.subtract(ids)
        for key in [k for k in ids if _TREE_WATCHED[k] <= 0]:
            del _TREE_WATCHED[key]


def watch_values(modules: list[torch.nn.Module]) -> None:
    """Move the epoch when a plain value of one of `modules` changes (until `unwatch_values`)."""
    with _lock:
        _VALUE_WATCHED.update(id(m) for m in modules)


def unwatch_values(ids: list[int]) -> None:
    with _lock:
        _VALUE_WATCHED.subtract(ids)
        for key in [k for k in ids if _VALUE_WATCHED[k] <= 0]:
            del _VALUE_WATCHED[key]


def _wrappers() -> list[tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]]]:
    module = torch.nn.Module
    out: list[tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = [
        (module, name, _bumping) for name in (*_HOOK_REGISTRATIONS, *_WHOLE_MODULE_METHODS)
    ]
    out.extend((module, name, _bumping_in_trees) for name in _STRUCTURE_METHODS)
    out.append((module, "train", _train))
    out.append((module, "__setattr__", _setattr))
    out.append((RemovableHandle, "remove", _bumping))
    namespaces = (torch.nn.modules.module, torch.nn.modules)
    for namespace in namespaces:
        out.extend((namespace, name, _bumping) for name in _GLOBAL_HOOK_FUNCTIONS if hasattr(namespace, name))
    return out


def _install() -> None:
    for owner, name, wrap in _wrappers():
        _patches.append(Patch(owner, name, wrap(owner.__dict__[name])).apply())


def _uninstall() -> None:
    while _patches:
        patch = _patches.pop()
        if not patch.restore():  # someone patched it after us: their patch stays (ours is then a plain bump)
            _logger.debug("%r was replaced again while aitune watched it; left in place", patch)


def acquire() -> None:
    """One more tuned module depends on the epoch: install the patches if they are not there."""
    global _users
    with _lock:
        if _users == 0:
            _install()
        _users += 1


def release() -> None:
    """A tuned module is gone: the last one restores every patched attribute to its exact original."""
    global _users
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0:
            _uninstall()


def installed() -> bool:
    """True while the patches are in place (some tuned module is alive)."""
    return bool(_patches)
